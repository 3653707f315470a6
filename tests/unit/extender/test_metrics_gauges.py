"""The scrape-time gauges the dashboard reads (charts/tessera/dashboards): a queue's quota and
limit beside its allocation, and per node and GPU how much is allocated."""

from __future__ import annotations

from tests import extender_objects as objects
from tests.unit.extender.test_server import CLASS, Extender, cluster, extender

__all__ = ["extender"]  # the fixture, used by name


async def test_quota_limit_and_gpu_occupancy_are_exported(extender: Extender) -> None:
    # Node a: gpu-0 held whole by team-a's pod (cluster()); node b: a 20Gi claim on its 80Gi
    # gpu-1, 20/80 = 0.25 of it.
    fraction = objects.pod("ns", "frac", queue="team-b", claim_name="frac-gpu", node_name="b")
    claim = objects.claim(
        "ns", "frac-gpu", objects.claim_spec(CLASS, memory="20Gi"), [("b", "gpu-1", "20Gi")]
    )
    extender.sync(cluster(fraction, claim))
    text = await (await extender.client.get("/metrics")).text()
    for line in (
        'tessera_queue_quota{queue="team-a",resource="gpu"} 1.0',
        'tessera_queue_limit{queue="team-a",resource="gpu"} 2.0',
        'tessera_queue_quota{queue="team-b",resource="gpu"} 3.0',
        'tessera_node_gpus{node="a"} 2.0',
        'tessera_node_gpus_allocated{node="a"} 1.0',  # 1 + 0
        'tessera_node_gpus_allocated{node="b"} 0.25',  # 0 + 0.25
        'tessera_gpu_allocated_fraction{gpu="0",node="a"} 1.0',
        'tessera_gpu_allocated_fraction{gpu="1",node="a"} 0.0',
        'tessera_gpu_allocated_fraction{gpu="1",node="b"} 0.25',
    ):
        assert line in text, line
    # team-b sets no limit: no series says one.
    assert 'tessera_queue_limit{queue="team-b"' not in text
