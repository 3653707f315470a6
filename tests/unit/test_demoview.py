"""The demo's screen, built from the cluster's objects as the API returns them."""

from __future__ import annotations

from typing import Any

from tessera.dev.demoview import Frame, gpus, queue_letters, queue_rows, render

DRIVER = "gpu.tessera.dev"


def _queue(name: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec, "status": status}


QUEUES = [
    _queue(
        "team-b",
        {"resources": {"gpu": {"quota": 2, "overQuotaWeight": 2}}},
        {"allocated": {"gpu": "0"}, "fairShare": {"gpu": "2"}, "requested": {"gpu": "2"}},
    ),
    _queue(
        "team-a",
        {"resources": {"gpu": {"quota": 1, "limit": 3}}},
        {"allocated": {"gpu": "2.5"}, "fairShare": {"gpu": "1.5"}, "evictedPods": 1},
    ),
]


def _slice(node: str, devices: int) -> dict[str, Any]:
    return {
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node},
            "devices": [
                {"name": f"gpu-{i}", "capacity": {"memory": {"value": "80Gi"}}} for i in range(devices)
            ],
        }
    }


def _claim(
    node: str, device: str, pods: list[str], memory: str | None = None, cls: str = DRIVER
) -> dict[str, Any]:
    result: dict[str, Any] = {"driver": DRIVER, "pool": node, "device": device}
    if memory:
        result["consumedCapacity"] = {"memory": memory}
    return {
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": p} for p in pods],
        },
    }


PODS = [
    {"metadata": {"uid": uid, "labels": {"scheduling.tessera.dev/queue": queue}}}
    for uid, queue in (("a0", "team-a"), ("a1", "team-a"), ("a2", "team-a"), ("a3", "team-a"))
]


def test_queue_rows_read_spec_and_status() -> None:
    rows = queue_rows(QUEUES)
    assert [r.name for r in rows] == ["team-a", "team-b"]
    a, b = rows
    assert (a.quota, a.limit, a.weight, a.allocated, a.fair_share, a.pending, a.evicted) == (
        1,
        3,
        1,
        2.5,
        1.5,
        0,
        1,
    )
    assert (b.quota, b.limit, b.weight, b.allocated, b.fair_share, b.pending) == (2, None, 2, 0, 2, 2)


def test_gpus_show_whole_fractional_and_time_sliced_holders() -> None:
    claims = [
        _claim("n1", "gpu-0", ["a0"]),
        _claim("n1", "gpu-1", ["a1"], memory="20Gi"),
        _claim("n1", "gpu-1", ["a2"], memory="40Gi"),
        _claim("n2", "gpu-0", ["a3", "a0"], cls="timesliced-gpu.tessera.dev"),
        _claim("n2", "gpu-1", []),  # allocated, no pod holds it any more: not drawn
    ]
    frame = Frame(
        "heading", queue_rows(QUEUES), gpus([_slice("n2", 2), _slice("n1", 2)], claims, PODS, DRIVER)
    )
    assert [(g.node, g.device, g.used_quarters) for g in frame.gpus] == [
        ("n1", "gpu-0", 4),
        ("n1", "gpu-1", 3),
        ("n2", "gpu-0", 4),
        ("n2", "gpu-1", 0),
    ]
    assert frame.gpus_in_use == 2.75 and frame.capacity == 4
    lines = render(frame)
    assert "  n1          AAAA AAA·" in lines and "  n2          aaaa ····" in lines
    (row_a,) = [line for line in lines if line.startswith("team-a")]
    # 1 GPU within quota, 1.5 beyond (drawn as 2 cells), nothing owed.
    assert "█▒▒ " in row_a and row_a.endswith("borrows 1.5 beyond quota")
    (row_b,) = [line for line in lines if line.startswith("team-b")]
    assert "░░" in row_b and row_b.endswith("below its fair share by 2: reclaiming")


def test_letters_are_the_team_suffix_then_free_ones() -> None:
    rows = queue_rows([_queue(n, {}, {}) for n in ("default", "team-a", "org-a", "team-d")])
    assert queue_letters(rows) == {"default": "D", "org-a": "A", "team-a": "T", "team-d": "E"}
