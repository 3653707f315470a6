"""An extender app behind aiohttp's test server, run as the service runs it (`SERVER_SETTINGS`:
bodies reach the handlers as sent). aiohttp's TestServer drops settings given to its constructor;
they go to `start_server`, before the client starts it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from extender.serving import SERVER_SETTINGS


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[TestClient[Any, Any]]:
    server = TestServer(app)
    await server.start_server(**SERVER_SETTINGS)
    async with TestClient(server) as client:
        yield client
