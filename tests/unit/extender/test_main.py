"""`tessera-extender` flags and the plain-HTTP operations port (--metrics-port)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio.client import ApiClient

from extender.__main__ import parse_args
from extender.rule_flags import NUMERIC_RULE_FLAGS
from extender.server import operations_app
from extender.service import ExtenderService, ServiceOptions


async def test_the_operations_port_serves_metrics_and_health_but_no_verb() -> None:
    """What Prometheus and kubelet probes need, without the scheduler's client certificate."""
    async with ApiClient() as api:
        service = ExtenderService(api, ServiceOptions())
        app = operations_app(service.picture, service.metrics, service.watcher.problem)
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/healthz")).status == 200
            assert (await client.get("/readyz")).status == 503  # nothing synced yet
            metrics = await client.get("/metrics")
            assert metrics.status == 200 and "tessera_extender_decisions_total" in await metrics.text()
            assert (await client.post("/bind", data="{}")).status == 404
            assert (await client.post("/filter", data="{}")).status == 404


def test_metrics_port_flag() -> None:
    assert parse_args([]).metrics_port == 0
    assert parse_args(["--metrics-port=9090"]).metrics_port == 9090
    with pytest.raises(SystemExit):
        parse_args(["--port=9090", "--metrics-port=9090"])


@pytest.mark.parametrize(
    "bad", [["--eviction-concurrency=0"], ["--eviction-timeout=0"], ["--eviction-timeout=-1"]]
)
def test_eviction_flags(bad: list[str]) -> None:
    args = parse_args([])
    assert (args.eviction_concurrency, args.eviction_timeout) == (16, 5.0)
    args = parse_args(["--eviction-concurrency=4", "--eviction-timeout=2.5"])
    assert (args.eviction_concurrency, args.eviction_timeout) == (4, 2.5)
    with pytest.raises(SystemExit):  # no call could ever go out, or none could wait for its answer
        parse_args(bad)


@pytest.mark.parametrize("flag", NUMERIC_RULE_FLAGS)
def test_a_negative_rule_flag_is_refused_by_name(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    # A negative wait or budget would make the reclaim loop act at once or never; the process
    # refuses to start instead, naming the flag (the queue simulator shares the check).
    assert parse_args([f"{flag}=0"]) is not None  # 0 is a wait (or a budget) of none
    with pytest.raises(SystemExit):
        parse_args([f"{flag}=-1"])
    assert f"cannot be negative: {flag} -1" in capsys.readouterr().err


def test_webhook_flags() -> None:
    assert parse_args([]).webhook_port == 0  # off
    tls = ["--tls-cert-file=a.crt", "--tls-key-file=a.key"]
    args = parse_args(["--webhook-port=8443", *tls])
    # The scheduler link's serving certificate serves the webhooks unless they get their own.
    assert (args.webhook_cert_file, args.webhook_key_file, args.admission_gate) == ("a.crt", "a.key", True)
    own = parse_args(["--webhook-port=8443", "--webhook-cert-file=w.crt", "--webhook-key-file=w.key", *tls])
    assert (own.webhook_cert_file, own.webhook_key_file) == ("w.crt", "w.key")
    assert parse_args(["--webhook-port=8443", "--no-admission-gate", *tls]).admission_gate is False
    with pytest.raises(SystemExit):  # the API server calls webhooks over https only
        parse_args(["--webhook-port=8443"])
    with pytest.raises(SystemExit):
        parse_args(["--webhook-port=8888", *tls])  # the scheduler's port
    # The API server's client certificate, required on the webhook port only.
    assert parse_args(
        ["--webhook-port=8443", "--webhook-client-ca-file=api.crt", *tls]
    ).webhook_client_ca_file == ("api.crt")
    with pytest.raises(SystemExit):
        parse_args(["--webhook-client-ca-file=api.crt", *tls])  # no webhook port to require it on


def test_size_caps_flags() -> None:
    defaults = parse_args([])
    assert (defaults.max_body_bytes, defaults.max_candidate_nodes) == (16 * 2**20, 10_000)
    assert parse_args(["--max-candidate-nodes=20000"]).max_candidate_nodes == 20_000


async def test_a_half_sent_request_does_not_hold_its_connection() -> None:
    """Headers that never end (a slow client, or an attack) cost a connection for idle_timeout_s."""
    async with ApiClient() as api:
        service = ExtenderService(api, ServiceOptions(host="127.0.0.1", port=0, idle_timeout_s=0.5))
        await service.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
            writer.write(b"POST /filter HTTP/1.1\r\nHost: tessera\r\nContent-Type: application/json\r\n")
            await writer.drain()
            # The server closes the connection: the read ends (EOF) instead of waiting for ever.
            assert await asyncio.wait_for(reader.read(), timeout=30) == b""
            writer.close()
        finally:
            await service.stop()
