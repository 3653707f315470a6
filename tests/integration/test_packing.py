"""Packing end to end on the real control plane, pod by pod as the simulator's deployed mode says.

``bench/packing.py`` at a small size: 12 nodes of the Alibaba trace (their GPUs, CPU and memory),
the trace's pods in the paper's shuffled order cut to 130% of their GPUs (about 100 pods: GPU pods
through ResourceClaimTemplates, GPU-less pods plain), created one by one on a control plane of its
own with kube-scheduler on the shipped profile, the extender and the DRA allocator in the
scheduler. The simulator's ``tessera-deployed`` is then fed the cluster's own choices pod by pod:
each pod must be on a node the model ranks best (unscheduled only where nothing fits) with the
GPUs the allocator's first fit gives, and the allocation must be within 0.5 point of the
deployed simulation's.
"""

from __future__ import annotations

import pytest

from bench.packing import run_packing_async, trace_slice
from tessera.simulate.trace import DEFAULT_PODS_FILE, NODES_FILE, default_trace_dir, load_nodes, load_pods

TRACE = default_trace_dir()

pytestmark = pytest.mark.skipif(TRACE is None, reason="the shared Alibaba trace is not checked out")


async def test_a_trace_slice_packs_as_the_deployed_simulation_says() -> None:
    assert TRACE is not None
    nodes = trace_slice(load_nodes(TRACE / NODES_FILE), 12, seed=0)
    rows, agreed = await run_packing_async(nodes, load_pods(TRACE / DEFAULT_PODS_FILE), seed=0, arrival=130.0)
    end_to_end, deployed, _policy_alone = rows
    assert agreed.nodes_agreed == agreed.pods, agreed
    assert agreed.devices_agreed == agreed.placed, agreed
    assert end_to_end.placed > 0.7 * end_to_end.pods  # most of it fits: the slice is not trivial
    assert abs(end_to_end.allocation_pct - deployed.allocation_pct) <= 0.5, rows
