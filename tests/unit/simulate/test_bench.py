"""The benchmark's synthetic picture and payloads are valid for both servers, and the extender's
answers are the decision functions' answers on the same picture (no timing here)."""

from __future__ import annotations

import msgspec
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio.client import ApiClient

from bench.hotpath import Payloads
from bench.memory import breakdown, breakdown_table
from bench.picture import GPUS_PER_NODE, build_picture, leaf_queues, load_picture, queue_tree
from bench.queuecycle import run_cycle, run_queuecycle
from bench.servers import CODECS, floor_app, tessera_app
from contract.names import QUEUE_LABEL
from extender.server import PICTURE_KEY
from extender.verbs import decide_filter, decide_priorities
from extender.wire import ExtenderArgs, decode, encode
from tests.unit.extender.pictures import reserved_pods

JSON = {"Content-Type": "application/json"}


def test_picture_fills_gpus_and_pods_as_documented() -> None:
    picture = build_picture(nodes=10, pods=500)
    counts = picture.count()
    assert counts["Node"] == counts["ResourceSlice"] == 10
    assert counts["Pod"] == 500
    live = load_picture(picture)
    free = sum(sum(live.node_gpus(name).free_milli) for name in picture.node_names)
    # 70% of the 80 GPUs are held (56), whole or as two halves.
    assert free == (10 * GPUS_PER_NODE - 56) * 1000


def test_the_queue_tree_has_1000_queues_with_pods_in_its_900_leaves() -> None:
    tree = queue_tree()
    picture = build_picture(nodes=10, pods=2000, tree=tree)
    assert len(picture.objects["Queue"]) == 1000 and len(leaf_queues(tree)) == 900
    pod_queues = {pod["metadata"]["labels"][QUEUE_LABEL] for pod in picture.objects["Pod"]}
    assert pod_queues == set(leaf_queues(tree))
    view = load_picture(picture).fairness()
    assert not view.invalid  # children's quotas (an even split of the parent's) add up
    assert len(view.fair_shares) == 1001  # and the default queue
    assert view.fair_shares["r0"]["gpu"] > 0


async def _cycle(app: web.Application, payloads: Payloads, cycle: int) -> tuple[object, object, bytes]:
    """The filter answer, the prioritize answer, and the prioritize request (the nodes passed)."""
    async with TestClient(TestServer(app)) as client:
        filtered = await client.post("/filter", data=payloads.body(cycle), headers=JSON)
        assert filtered.status == 200
        asked = payloads.after(cycle, await filtered.read())
        scored = await client.post("/prioritize", data=asked, headers=JSON)
        assert scored.status == 200
        return await filtered.json(), await scored.json(), asked


async def test_extender_and_floor_answer_the_same_payloads() -> None:
    api = ApiClient()
    try:
        app, objects = tessera_app(nodes=6, pods=100, api=api)
        assert objects > 100
        for mode in ("names", "nodelist"):
            payloads = Payloads(6, mode)
            ours, our_scores, asked = await _cycle(app, payloads, cycle=1)
            assert isinstance(ours, dict) and not ours.get("Error"), ours
            assert isinstance(our_scores, list) and len(our_scores) == 6
            for kind in CODECS:  # both floors pass every node, with score 0
                floor, floor_scores, _ = await _cycle(floor_app(kind), payloads, cycle=1)
                assert isinstance(floor, dict) and isinstance(floor_scores, list)
                assert len(floor_scores) == 6 and {s["Score"] for s in floor_scores} == {0}
            # What the server said is what the verbs decide on the same picture and request.
            args = decode(ExtenderArgs, payloads.body(1))
            picture = app[PICTURE_KEY]
            expected = msgspec.json.decode(encode(decide_filter(picture, args).result))
            assert ours == expected
            scores = decide_priorities(picture, decode(ExtenderArgs, asked)).scores
            assert {h["Host"]: h["Score"] for h in our_scores} == scores
            assert any(score > 0 for score in scores.values())  # GPU pods are ranked, not neutral
    finally:
        await api.close()


def test_the_memory_breakdown_counts_every_object_of_the_picture_once() -> None:
    objects, rows = breakdown(nodes=4, pods=100)
    parts = {name: (count, size) for name, count, size in rows}
    # 4 nodes and their 4 slices, 100 pods, a claim per GPU pod, 2 templates, a class, 2 queues.
    assert parts["store: Pod"][0] == 100 and parts["store: Node"][0] == parts["store: ResourceSlice"][0] == 4
    assert objects == sum(count for name, count, _ in rows if name.startswith("store: "))
    assert all(size > 0 for name, _, size in rows if name.startswith("store: "))
    assert "total" in breakdown_table(objects, rows)


def test_a_queue_cycle_admits_and_reserves_each_new_pod_in_a_leaf_of_the_tree() -> None:
    # bench.queuecycle's cycle on a 10-node picture with the 1000-queue tree: each of 3 new pods
    # (in 3 different leaves) is admitted and reserved, as the server's filter does; the table
    # has a row per picture, the flat one at 1.00x of itself.
    tree = queue_tree()
    picture = load_picture(build_picture(nodes=10, pods=200, tree=tree))
    payloads = Payloads(10, "names", tree=True)
    spent = [0.0, 0.0, 0.0]
    for cycle in range(3):
        run_cycle(picture, payloads.body(cycle), spent)
    reserved = sorted(reserved_pods(picture))
    assert reserved == [f"bench/pending-{cycle:07d}" for cycle in range(3)]
    queues = {reserved_pods(picture)[key]["metadata"]["labels"][QUEUE_LABEL] for key in reserved}
    assert queues == set(leaf_queues(tree)[:3])
    rows = run_queuecycle([10], pods=100, cycles=2)
    assert [row[:3] for row in rows] == [["10", "2 flat", "2"], ["10", "1000 in 3 levels", "2"]]
    assert rows[0][-1] == "1.00x"
