"""The queue simulator's topology: node groups laid out over levels, gangs placed with the
extender's domain planner (`extender.policy.topology.plan_in_domain`), the domains they span."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import tessera.simulate
from tessera.simulate.queues import (
    GangRecord,
    WorkloadError,
    load_workload,
    parse_workload,
    run_queue_workload,
)

EXAMPLE = Path(tessera.simulate.__file__).parent / "examples" / "topology-racks.yaml"
LEVELS = [{"name": "block", "label": "example.com/block"}, {"name": "rack", "label": "example.com/rack"}]


def workload(jobs: list[dict[str, Any]], layout: list[int] | None = None, count: int = 8) -> dict[str, Any]:
    return {
        "topology": LEVELS,
        "nodes": [{"name": "n", "count": count, "gpus": 4, "layout": [2, 2] if layout is None else layout}],
        "queues": [{"name": "q"}],
        "jobs": jobs,
    }


def test_a_layout_of_2_blocks_x_2_racks_puts_2_nodes_in_each_rack() -> None:
    parsed = parse_workload(workload([{"name": "j", "queue": "q", "duration": 10}]))
    racks = parsed.level_domains["rack"]
    # 8 nodes / (2 x 2) = 2 a rack, in order: n-0, n-1 in block0/rack0; n-6, n-7 in block1/rack1.
    assert [racks[f"n-{i}"] for i in range(8)] == [
        "block0/rack0", "block0/rack0", "block0/rack1", "block0/rack1",
        "block1/rack0", "block1/rack0", "block1/rack1", "block1/rack1",
    ]  # fmt: skip
    assert parsed.level_domains["block"]["n-5"] == "block1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layout": [3, 2]}, "8 nodes do not split into 6 domains"),
        ({"layout": [2, 2, 2]}, "layout [2, 2, 2] does not fit the topology levels"),
        ({"ask": "topologyRequired", "level": "row"}, "topology level 'row' (required) is not one of"),
    ],
)
def test_bad_layouts_and_asks_are_refused_naming_them(change: dict[str, Any], message: str) -> None:
    job: dict[str, Any] = {"name": "j", "queue": "q", "count": 2, "minMembers": 2, "duration": 10}
    if "ask" in change:
        job[change["ask"]] = change["level"]
    with pytest.raises(WorkloadError, match=re.escape(message)):
        parse_workload(workload([job], change.get("layout")))


def test_a_gang_requiring_a_rack_starts_inside_one() -> None:
    # Racks of 2 nodes x 4 GPUs (8 a rack); 3 lone 1-GPU pods run first, wherever the policy puts
    # them; a gang of 8 requiring a rack then needs a rack the lone pods left whole.
    jobs = [
        {"name": "lone", "queue": "q", "count": 3, "duration": 50},
        {"name": "ring", "queue": "q", "count": 8, "minMembers": 8, "arrival": 1, "duration": 10,
         "topologyRequired": "rack"},
    ]  # fmt: skip
    result = run_queue_workload(parse_workload(workload(jobs)))
    ring = next(g for g in result.gangs if g.name == "ring")
    assert (ring.ask, ring.spanned["rack"]) == ("required rack", 1)


def test_the_example_packs_gangs_into_fewer_racks_than_without_their_asks() -> None:
    # tessera/simulate/examples/topology-racks.yaml; the table is in docs/workloads.md.
    example = load_workload(EXAMPLE)
    asked = run_queue_workload(example)
    plain = run_queue_workload(example, topology_asks=False)

    def mean_racks(gangs: list[GangRecord]) -> float:
        return sum(g.spanned["rack"] for g in gangs) / len(gangs)

    assert len(asked.gangs) == len(plain.gangs) == 12
    # Every gang requiring a level started within one domain of it.
    for gang in asked.gangs:
        if gang.ask.startswith("required"):
            assert gang.spanned[gang.ask.split()[1]] == 1, gang
    assert mean_racks(asked.gangs) < mean_racks(plain.gangs)
    assert asked.refusals.get("gang_no_domain", 0) > 0  # (the block gang waited for a block)
