"""What the extender's two HTTP servers - the verbs' (`extender.server`) and the webhooks'
(`extender.webhook`) - share: a request body read within limits (a 4xx with the reason when it is
too large, slow, in an unknown encoding or malformed), each handler timed and the requests in
flight bounded, how aiohttp must run for that, and TLS.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from extender.metrics import ExtenderMetrics

# kube-scheduler gives up on an extender after 5 s: a body still arriving after this is not its.
BODY_TIMEOUT_S = 5.0
# Content-Encodings a body may come in (kube-scheduler and the API server send none): zlib detects
# a gzip or zlib header itself (wbits 32 + 15).
_DECOMPRESSIBLE = frozenset({"gzip", "x-gzip", "deflate"})
_ZLIB_AUTO_HEADER = 32 + zlib.MAX_WBITS
# How the HTTP server must run for parse_body to see the body as sent: aiohttp would otherwise
# decompress it before the handler, without a bound on the output, and drop the connection on a
# body its Content-Encoding does not fit. For web.AppRunner and aiohttp's TestServer.
SERVER_SETTINGS: dict[str, Any] = {"auto_decompress": False}

METRICS_KEY = web.AppKey("metrics", ExtenderMetrics)
IN_FLIGHT_KEY = web.AppKey("in_flight", asyncio.Semaphore)
# The most bytes a body may have, compressed or decompressed.
BODY_LIMIT_KEY = web.AppKey("body_limit", int)

T = TypeVar("T")


def bad_request(request: web.Request, verb: str, problem: str) -> web.HTTPBadRequest:
    request.app[METRICS_KEY].bad_requests.labels(verb).inc()
    return web.HTTPBadRequest(text=f"malformed {verb} request: {problem}")


def too_large(request: web.Request, verb: str, problem: str) -> web.HTTPRequestEntityTooLarge:
    request.app[METRICS_KEY].bad_requests.labels(verb).inc()
    limit = request.app[BODY_LIMIT_KEY]
    return web.HTTPRequestEntityTooLarge(limit, text=f"{verb} request too large: {problem}")


async def read_body(request: web.Request, verb: str) -> bytes:
    """The request body as sent, decompressed; a 4xx with the reason when it is too large (413, told
    by Content-Length before reading, or while decompressing), slow (408), in an encoding not
    supported (415) or broken (400).

    The body is read whole before its encoding is looked at, so a refused one still ends where its
    Content-Length says and the connection serves the next request. Decompression stops at the
    limit: a small body that inflates to gigabytes costs the limit, not its size.
    """
    limit = request.app[BODY_LIMIT_KEY]
    if request.content_length is not None and request.content_length > limit:
        raise too_large(request, verb, f"Content-Length {request.content_length} over {limit} bytes")
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):  # (no task per request, as wait_for makes)
            body = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise too_large(request, verb, f"body over {limit} bytes") from exc
    except TimeoutError as exc:
        request.app[METRICS_KEY].bad_requests.labels(verb).inc()
        message = f"malformed {verb} request: body not received within {BODY_TIMEOUT_S:g}s"
        raise web.HTTPRequestTimeout(text=message) from exc
    except web.HTTPException:
        raise
    except Exception as exc:  # broken chunking, a connection reset: the client's fault
        raise bad_request(request, verb, f"body could not be read: {exc}") from exc
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in _DECOMPRESSIBLE:
        request.app[METRICS_KEY].bad_requests.labels(verb).inc()
        raise web.HTTPUnsupportedMediaType(
            text=f"malformed {verb} request: Content-Encoding {encoding!r} is not supported "
            f"(identity, {', '.join(sorted(_DECOMPRESSIBLE))})"
        )
    inflate = zlib.decompressobj(_ZLIB_AUTO_HEADER)
    try:
        plain = inflate.decompress(body, limit + 1)
    except zlib.error as exc:
        raise bad_request(request, verb, f"body is not valid {encoding}: {exc}") from exc
    if len(plain) > limit:
        raise too_large(request, verb, f"body decompresses to over {limit} bytes")
    if not inflate.eof:
        raise bad_request(request, verb, f"body is not valid {encoding}: it ends early")
    return plain


def decoded(request: web.Request, body: bytes, decode_body: Callable[[bytes], T], verb: str) -> T:
    """`decode_body(body)`; a 400 with the reason when it raises a ValueError naming the problem
    (msgspec's and pydantic's errors are ValueErrors) or a RecursionError (JSON nested deeper
    than the decoder goes: msgspec raises that, not a DecodeError)."""
    try:
        return decode_body(body)
    except (ValueError, RecursionError) as exc:
        raise bad_request(request, verb, str(exc)) from exc


async def parse_body(request: web.Request, decode_body: Callable[[bytes], T], verb: str) -> T:
    """The request body (`read_body`), decoded by `decode_body` (`decoded`)."""
    return decoded(request, await read_body(request, verb), decode_body, verb)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def timed(verb: str, handler: Handler) -> Handler:
    """Time a verb, and bound how many requests are handled at once (a flood gets 503s quickly
    instead of queueing until the scheduler's 5 s timeout for everyone)."""

    async def bounded(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        in_flight = request.app[IN_FLIGHT_KEY]
        if in_flight.locked():
            request.app[METRICS_KEY].bad_requests.labels(verb).inc()
            raise web.HTTPServiceUnavailable(text=f"{verb}: too many requests in flight; retry")
        async with in_flight:
            try:
                return await handler(request)
            finally:
                request.app[METRICS_KEY].latency.labels(verb).observe(time.perf_counter() - started)

    return bounded


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str | None) -> ssl.SSLContext:
    """TLS for the scheduler link; with a client CA, only clients with a cert it signed get in."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
