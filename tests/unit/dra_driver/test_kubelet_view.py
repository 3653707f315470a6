"""The driver as a real kubelet sees it: every call through ``tests.kubelet``, a client built from
the kubelet's own ``.proto`` files that imports nothing from ``dra_driver``.

Covers what a kubelet depends on beyond the response shapes: request names it can match, a health
stream that never goes quiet, one driver instance per node across a rolling update, no stall
behind a hanging API read, and nothing left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from dra_driver import cdi
from dra_driver.checkpoint import Checkpoint, ClaimRecord
from dra_driver.plugin import HEALTH_CHECK_TIMEOUT_S, HEALTH_REFRESH_S, SocketState, socket_state
from dra_driver.prepare import ApiClaimReader
from tests.kubelet.client import DEFAULT_HEALTH_TIMEOUT_S, ClaimRef, HealthView, Kubelet, container_cdi_ids

from .fakes import DRIVER, NODE, FakeClaims, Result, claim, make_plugin

FRACTION = ClaimRef("ns", "uid-frac", "frac")


@pytest.fixture
def claims() -> FakeClaims:
    fake = FakeClaims()
    fake.add(claim("uid-frac", [Result("gpu-1", memory="20Gi")], name="frac"))
    fake.add(claim("uid-sub", [Result("gpu-0", request="gpu/h100")], name="sub"))
    fake.add(claim("uid-other", [Result("nic-0", driver="net.example.com", pool="p")], name="other"))
    fake.add(claim("uid-big", [Result("gpu-0", memory="96Gi")], name="big"))
    return fake


@contextlib.contextmanager
def logged(text: str) -> Iterator[asyncio.Event]:
    """An event set once the plugin logs a message containing ``text``."""
    seen = asyncio.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if text in record.getMessage():
                seen.set()

    logger = logging.getLogger("dra_driver.plugin")
    handler, level = Watch(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextlib.asynccontextmanager
async def started(root: Path, claims: Any, **options: Any) -> AsyncIterator[tuple[Any, Kubelet, str]]:
    """A started plugin, a kubelet that registered it, and the DRA endpoint GetInfo named."""
    plugin, _ = make_plugin(root, claims, **options)
    await plugin.start()
    try:
        kubelet = Kubelet(plugin.sockets.registration)
        info = await kubelet.register()
        yield plugin, kubelet, info.endpoint
    finally:
        await plugin.stop(grace_s=0)


# ---- 1. request names ----


async def test_a_subrequest_device_reaches_the_container_that_names_the_request(
    root: Path, claims: FakeClaims
) -> None:
    async with started(root, claims) as (_, kubelet, endpoint):
        prepared = (await kubelet.prepare(endpoint, [ClaimRef("ns", "uid-sub", "sub")]))["uid-sub"]
    assert prepared.error == ""
    # The allocation names the result "gpu/h100"; the container says `request: gpu`.
    assert [list(d.request_names) for d in prepared.devices] == [["gpu"]]
    assert container_cdi_ids(prepared, "gpu") == [f"k8s.{DRIVER}/claim=uid-sub-gpu-0"]


async def test_getinfo_names_an_absolute_endpoint_for_a_relative_plugin_dir(
    root: Path, claims: FakeClaims, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(root)
    async with started(Path("rel"), claims) as (plugin, _, endpoint):
        assert endpoint == str(root / "rel" / "plugins" / DRIVER / "dra.sock")
        assert plugin.registered.is_set()  # the kubelet client refuses relative endpoints


# ---- 2. health ----


async def test_health_is_sent_again_in_full_without_any_change(root: Path, claims: FakeClaims) -> None:
    view = HealthView()
    stamps: list[int] = []
    async with (
        started(root, claims, health_refresh_s=0.05) as (_, kubelet, endpoint),
        contextlib.aclosing(kubelet.watch_health(endpoint)) as stream,
    ):
        async for response in stream:
            assert sorted(d.device.device_name for d in response.devices) == ["gpu-0", "gpu-1"]
            view.record(response)
            stamps.append(min(d.last_updated_time for d in response.devices))
            if len(stamps) == 3:
                break
    assert [view.health(NODE, name) for name in ("gpu-0", "gpu-1")] == ["HEALTHY", "HEALTHY"]
    assert stamps == sorted(stamps)  # each message is as fresh as the one before
    # Refreshed several times within the timeout it declares, and within the kubelet's default.
    assert min(HEALTH_CHECK_TIMEOUT_S, DEFAULT_HEALTH_TIMEOUT_S) >= HEALTH_REFRESH_S * 3


def test_the_kubelet_forgets_health_it_does_not_hear_again() -> None:
    """What the refresh prevents: the kubelet's view goes Unknown after the declared timeout."""
    view = HealthView()
    response = type("Response", (), {"devices": []})()
    view.devices[(NODE, "gpu-0")] = ("HEALTHY", 100.0, HEALTH_CHECK_TIMEOUT_S)
    view.record(response, received_at=100.0)
    assert view.health(NODE, "gpu-0", at=100.0 + HEALTH_CHECK_TIMEOUT_S - 1) == "HEALTHY"
    assert view.health(NODE, "gpu-0", at=100.0 + HEALTH_CHECK_TIMEOUT_S + 1) == "UNKNOWN"


# ---- 3. socket ownership ----


async def test_rolling_update_overlap_hands_the_node_over_without_losing_anything(
    root: Path, claims: FakeClaims
) -> None:
    old, _ = make_plugin(root, claims)
    await old.start()
    kubelet = Kubelet(old.sockets.registration)
    endpoint = (await kubelet.register()).endpoint
    # The new DaemonSet pod starts while the old one still runs.
    new, _ = make_plugin(root, claims)
    with logged("another instance of this driver holds") as waiting:
        taking_over = asyncio.create_task(new.start())
        await asyncio.wait_for(waiting.wait(), 10)
    try:
        # The old instance keeps serving from its own sockets; what it prepares now is not lost.
        assert socket_state(old.sockets.registration) is SocketState.LIVE
        prepared = (await kubelet.prepare(endpoint, [FRACTION]))["uid-frac"]
        assert prepared.error == "" and not taking_over.done()
        await old.stop()
        await asyncio.wait_for(taking_over, 10)
        # The old instance's shutdown removed its sockets only; the new one serves the same paths.
        await old.stop()
        assert socket_state(new.sockets.registration) is SocketState.LIVE
        assert socket_state(new.sockets.dra) is SocketState.LIVE
        assert (await kubelet.register()).endpoint == endpoint
        # It read the checkpoint after the old one let go: the claim is answered from it...
        reads = claims.reads
        again = (await kubelet.prepare(endpoint, [FRACTION]))["uid-frac"]
        assert again == prepared and claims.reads == reads
        # ...and unprepared with everything it holds.
        assert await kubelet.unprepare(endpoint, [FRACTION]) == {"uid-frac": ""}
        assert list((root / "cdi").iterdir()) == []
    finally:
        taking_over.cancel()
        await new.stop(grace_s=0)


async def test_stop_leaves_a_socket_that_is_no_longer_its_own(root: Path, claims: FakeClaims) -> None:
    plugin, _ = make_plugin(root, claims)
    await plugin.start()
    path = plugin.sockets.registration
    path.unlink()  # replaced behind its back (say, by an instance that does not take the lock)
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))
        other.listen()
        await plugin.stop(grace_s=0)
        assert socket_state(path) is SocketState.LIVE
    assert not plugin.sockets.dra.exists()


async def test_a_live_socket_is_waited_for_not_taken_over(root: Path, claims: FakeClaims) -> None:
    plugin, _ = make_plugin(root, claims)
    path = plugin.sockets.registration
    path.parent.mkdir(parents=True)
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(path))
    other.listen()
    with logged("served by another live process") as waiting:
        starting = asyncio.create_task(plugin.start())
        await asyncio.wait_for(waiting.wait(), 10)
    try:
        assert not starting.done()
        other.close()  # the other process goes; its socket file stays behind, dead
        await asyncio.wait_for(starting, 10)
        assert (await Kubelet(path).register()).name == DRIVER
    finally:
        other.close()
        starting.cancel()
        await plugin.stop(grace_s=0)


async def test_a_regular_file_at_a_socket_path_is_refused_and_kept(root: Path, claims: FakeClaims) -> None:
    plugin, _ = make_plugin(root, claims)
    path = plugin.sockets.registration
    path.parent.mkdir(parents=True)
    path.write_text("not a socket")
    with pytest.raises(FileExistsError, match="not a socket; refusing"):
        await plugin.start()
    assert path.read_text() == "not a socket"  # a failed start removes nothing it did not create
    assert not plugin.sockets.dra.exists()
    path.unlink()
    async with started(root, claims) as (_, _, endpoint):  # and it let go of the node
        assert endpoint == str(plugin.sockets.dra)


# ---- 4. no stalls behind the API ----


@dataclass
class FakeApiServer:
    """Serves ResourceClaims like the apiserver; reads of ``held`` claims wait for ``release``."""

    claims: FakeClaims
    held: set[str] = field(default_factory=set)
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if name in self.held:
            self.holding.set()
            await self.release.wait()
        obj = self.claims.claims.get((namespace, name))
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        return web.json_response(obj)


@contextlib.asynccontextmanager
async def fake_apiserver(server: FakeApiServer) -> AsyncIterator[ApiClient]:
    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}", server.read)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api = ApiClient(Configuration(host=f"http://127.0.0.1:{port}"))
    try:
        yield api
    finally:
        server.release.set()
        await api.close()
        await runner.cleanup()


async def test_a_hanging_api_read_stalls_only_its_own_claim(root: Path, claims: FakeClaims) -> None:
    claims.add(claim("uid-slow", [Result("gpu-1")], name="slow"))  # gpu-1 is free once frac goes
    server = FakeApiServer(claims, held={"slow"})
    async with (
        fake_apiserver(server) as api,
        started(root, ApiClaimReader(api)) as (_, kubelet, endpoint),
    ):
        assert (await kubelet.prepare(endpoint, [FRACTION]))["uid-frac"].error == ""
        slow = asyncio.create_task(kubelet.prepare(endpoint, [ClaimRef("ns", "uid-slow", "slow")]))
        await asyncio.wait_for(server.holding.wait(), 10)  # its API read is in flight, unanswered
        # Unrelated claims go on meanwhile: an unprepare (no API call) and another prepare.
        assert await kubelet.unprepare(endpoint, [FRACTION]) == {"uid-frac": ""}
        assert (await kubelet.prepare(endpoint, [ClaimRef("ns", "uid-sub", "sub")]))["uid-sub"].error == ""
        assert not slow.done()
        server.release.set()
        assert (await slow)["uid-slow"].error == ""


async def test_an_api_read_that_never_ends_is_a_claim_error_after_the_bound(
    root: Path, claims: FakeClaims
) -> None:
    server = FakeApiServer(claims, held={"frac"})
    async with (
        fake_apiserver(server) as api,
        started(root, ApiClaimReader(api, timeout_s=0.3)) as (_, kubelet, endpoint),
    ):
        error = (await kubelet.prepare(endpoint, [FRACTION]))["uid-frac"].error
    assert error == "reading ResourceClaim ns/frac: no answer from the API server within 0.3 s"


# ---- 5. leaks and silent outcomes ----


async def test_start_removes_what_a_crash_left_behind(root: Path, claims: FakeClaims) -> None:
    plugin, _ = make_plugin(root, claims)
    cdi_dir, state_dir = root / "cdi", root / "state"
    cdi_dir.mkdir()
    state_dir.mkdir()
    ours = cdi_dir / f".k8s.{DRIVER}-claim_uid-a.json.x1y2.tmp"
    theirs = cdi_dir / ".k8s.net.example.com-claim_uid-b.json.z3.tmp"
    checkpoint_tmp = state_dir / ".checkpoint.json.q9.tmp"
    orphan = cdi.spec_path(cdi_dir, DRIVER, "uid-orphan")  # written, never recorded, then a crash
    half = cdi.spec_path(cdi_dir, DRIVER, "uid-half")
    for path in (ours, theirs, checkpoint_tmp, orphan, half):
        path.write_text("{")
    record = ClaimRecord(namespace="ns", name="half", state="started", cdi_spec=str(half))
    checkpoint = Checkpoint(state_dir)  # after the plugin was built: read again at start
    # Two generations, so both slots are whole and the checkpoint proves it is complete.
    checkpoint.put("uid-half", record.model_copy(update={"name": "earlier"}))
    checkpoint.put("uid-half", record)
    await plugin.start()
    try:
        # The half-prepared claim is rolled back at start too (all such claims at once, so each
        # GPU is reset at most once), before the kubelet calls again.
        assert sorted(p.name for p in cdi_dir.iterdir()) == [theirs.name]
        assert not checkpoint_tmp.exists()
        assert Checkpoint(state_dir).claims == {}
        errors = await Kubelet(plugin.sockets.registration).unprepare(
            str(plugin.sockets.dra), [ClaimRef("ns", "uid-half", "half")]
        )
        assert errors == {"uid-half": ""}
    finally:
        await plugin.stop(grace_s=0)


async def test_a_claim_of_other_drivers_only_gets_no_devices_and_no_spec(
    root: Path, claims: FakeClaims
) -> None:
    async with started(root, claims) as (_, kubelet, endpoint):
        prepared = (await kubelet.prepare(endpoint, [ClaimRef("ns", "uid-other", "other")]))["uid-other"]
        assert (prepared.error, list(prepared.devices)) == ("", [])
        assert not (root / "cdi").exists() or list((root / "cdi").iterdir()) == []
        assert await kubelet.unprepare(endpoint, [ClaimRef("ns", "uid-other", "other")]) == {"uid-other": ""}


async def test_consumed_memory_above_the_device_is_refused_with_the_numbers(
    root: Path, claims: FakeClaims
) -> None:
    async with started(root, claims) as (_, kubelet, endpoint):
        error = (await kubelet.prepare(endpoint, [ClaimRef("ns", "uid-big", "big")]))["uid-big"].error
    assert error == (
        "request gpu consumes 96Gi (103079215104 bytes) of memory, more than device gpu-0 has "
        "(80Gi, 85899345920 bytes)"
    )
