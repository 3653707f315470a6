"""Pure parts of the KAI contender: queue mirroring, its configuration, its pods, the skip message,
the order of the rounds and the tables with KAI's rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.e2e import BoundPods, alternating, gpu_pod, slice_layout
from bench.kai import (
    COMPONENTS,
    DEFAULT_ACTIONS,
    DIR_ENV,
    KAI_PARENT_QUEUE,
    KAI_QUEUE_LABEL,
    KAI_SCHEDULER,
    NO_CONSOLIDATION,
    PIN_FILE,
    component_args,
    find_kai,
    install_dir,
    kai_pod,
    kai_queues,
    missing_parts,
    read_pin,
    scheduler_config,
    skip_message,
    skip_reason,
)
from bench.reaction import ReactionRun, vs_plain
from bench.reclaim import ReclaimResult, ReclaimRun, as_job, reclaim_table
from contract.names import DEFAULT_QUEUE, QUEUE_LABEL
from extender.policy.fairness import QueueSpec


def test_two_flat_queues_go_under_one_parent_that_holds_their_quotas() -> None:
    mirrored = kai_queues([QueueSpec("a", quota={"gpu": 16}), QueueSpec("b", quota={"gpu": 16})])
    by_name = {queue["metadata"]["name"]: queue for queue in mirrored}
    assert [queue["metadata"]["name"] for queue in mirrored] == [KAI_PARENT_QUEUE, "a", "b"]
    assert {queue["apiVersion"] for queue in mirrored} == {"scheduling.run.ai/v2"}
    parent = by_name[KAI_PARENT_QUEUE]["spec"]
    assert "parentQueue" not in parent
    assert parent["resources"]["gpu"] == {"quota": 32, "limit": -1, "overQuotaWeight": 1.0}  # 16 + 16
    for name in ("a", "b"):
        spec = by_name[name]["spec"]
        assert spec["parentQueue"] == KAI_PARENT_QUEUE
        assert spec["priority"] == 100  # KAI's default for Tessera's 0
        assert spec["resources"]["gpu"] == {"quota": 16, "limit": -1, "overQuotaWeight": 1.0}
        assert spec["resources"]["cpu"] == {"quota": 0, "limit": -1, "overQuotaWeight": 1.0}
        assert "reclaimMinRuntime" not in spec


def test_units_limits_weights_priorities_runtimes_and_a_tree() -> None:
    specs = [
        QueueSpec("org", quota={"gpu": 8, "cpu": 4}),
        QueueSpec(
            "team",
            parent="org",
            priority=5,
            quota={"gpu": 2, "cpu": 1.5, "memory": 8e9, "gpu/h100": 1},
            limit={"gpu": 4, "memory": 16e9},
            over_quota_weight={"gpu": 3},
            reclaim_min_runtime_s=90,
            preempt_min_runtime_s=0.5,
        ),
    ]
    by_name = {queue["metadata"]["name"]: queue["spec"] for queue in kai_queues(specs)}
    # Only top-level queues count into the added parent: org's 8 GPUs and 4 cores, not team's.
    assert by_name[KAI_PARENT_QUEUE]["resources"]["gpu"]["quota"] == 8
    assert by_name[KAI_PARENT_QUEUE]["resources"]["cpu"]["quota"] == 4000  # 4 cores x 1000
    assert by_name["org"]["parentQueue"] == KAI_PARENT_QUEUE
    team = by_name["team"]
    assert team["parentQueue"] == "org"
    assert team["priority"] == 105  # 100 + 5
    assert team["resources"]["gpu"] == {"quota": 2, "limit": 4, "overQuotaWeight": 3}
    assert team["resources"]["cpu"] == {"quota": 1500, "limit": -1, "overQuotaWeight": 1.0}  # 1.5 x 1000
    assert team["resources"]["memory"] == {"quota": 8000, "limit": 16000, "overQuotaWeight": 1.0}  # MB
    assert set(team["resources"]) == {"gpu", "cpu", "memory"}  # gpu/h100: no KAI field
    assert (team["reclaimMinRuntime"], team["preemptMinRuntime"]) == ("90s", "0.5s")


def test_scheduler_config_is_the_operators_default_with_or_without_consolidation() -> None:
    default = scheduler_config(DEFAULT_ACTIONS.consolidation)
    # Actions by priority: allocate 500, consolidation 400, reclaim 300, preempt 200, stale... 100.
    assert default["actions"] == "allocate, consolidation, reclaim, preempt, stalegangeviction"
    assert scheduler_config(NO_CONSOLIDATION.consolidation)["actions"] == (
        "allocate, reclaim, preempt, stalegangeviction"
    )
    plugins = default["tiers"][0]["plugins"]
    # Plugins by priority, 1900 down to 100; the scenario generators (360, 350) before gpupack
    # (300); gpuspread (also 300) off under GPU binpack.
    assert [plugin["name"] for plugin in plugins] == [
        *("predicates", "proportion", "priority", "nodeavailability", "resourcetype", "podaffinity"),
        *("elastic", "kubeflow", "ray", "subgrouporder", "taskorder", "nominatednode"),
        *("dynamicresources", "minruntime", "topology", "snapshot"),
        *("sg-nodelocalgreedy", "sg-multinodegang", "gpupack", "nodeplacement", "gpusharingorder"),
    ]
    assert {"name": "nodeplacement", "arguments": {"cpu": "binpack", "gpu": "binpack"}} in plugins
    budgets = default["scenarioSearchBudgets"]
    assert budgets["maxGeneratorSearchDuration"] == {
        "default": "2m",
        "NodeLocalGreedy": "30s",
        "MultiNodeGang": "2m",
    }


def test_flags_are_the_operators_on_loopback_and_a_variant_may_set_every_clients_qps() -> None:
    ports = {"metrics": 9001, "probe": 9002}
    binder = component_args("binder", Path("/c.yaml"), ports)
    assert binder[binder.index("--qps") + 1] == "20" and binder[binder.index("--burst") + 1] == "100"
    assert "--metrics-bind-address=127.0.0.1:9001" in binder
    assert "--health-probe-bind-address=127.0.0.1:9002" in binder
    assert not any(flag.startswith("--cdi") for flag in binder)  # CDI is gpusharing's argument now
    assert json.loads(binder[binder.index("--plugins") + 1])["gpusharing"]["arguments"] == {
        "cdiEnabled": "false"
    }
    scheduler = component_args("scheduler", Path("/c.yaml"), ports)
    assert "--scheduler-conf=/c.yaml" in scheduler and "--listen-address=127.0.0.1:9001" in scheduler
    assert not any(flag.startswith("--qps") for flag in scheduler)  # its built-in 50 / 300
    podgrouper = component_args("podgrouper", Path("/c.yaml"), ports)
    assert "--generic-karta-fallback=true" in podgrouper and "--qps" not in podgrouper
    for name in ("podgroupcontroller", "queuecontroller"):  # the operator's 20 / 100 since #2027
        flags = component_args(name, Path("/c.yaml"), ports)
        assert flags[-4:] == ["--qps", "20", "--burst", "100"]
    assert "--enable-webhook=false" in component_args("queuecontroller", Path("/c.yaml"), ports)
    for name in COMPONENTS:
        flags = component_args(name, Path("/c.yaml"), ports, client=(500, 1000))
        assert flags[-2:] == ["--qps=500", "--burst=1000"] and "--qps" not in flags


def test_kais_pod_is_the_same_pod_with_its_scheduler_name_and_queue_label() -> None:
    tessera = gpu_pod("ns", "a-00001", "bench-tessera", queue="a")
    kai = gpu_pod("ns", "a-00001", KAI_SCHEDULER, queue="a")
    assert kai["spec"] == {**tessera["spec"], "schedulerName": KAI_SCHEDULER}
    assert kai["metadata"]["labels"] == {QUEUE_LABEL: "a", KAI_QUEUE_LABEL: "a"}
    # Without a queue, Tessera's default queue (mirrored for KAI in the end-to-end benchmark).
    assert gpu_pod("ns", "p", KAI_SCHEDULER)["metadata"]["labels"] == {KAI_QUEUE_LABEL: DEFAULT_QUEUE}
    assert kai_pod(tessera, "b")["metadata"]["labels"][KAI_QUEUE_LABEL] == "b"
    assert tessera["metadata"]["labels"] == {QUEUE_LABEL: "a"}  # the original is left alone


def test_the_build_directory_follows_the_build_scripts_rule() -> None:
    pin = read_pin(PIN_FILE.read_text())
    assert set(pin) == {"KAI_MODULE", "KAI_REVISION"}
    revision = pin["KAI_REVISION"]
    home = Path("/home/u")
    assert install_dir(pin, {}, home) == home / ".cache" / "tessera" / f"kai-{revision}"
    assert install_dir(pin, {"XDG_CACHE_HOME": "/x"}, home) == Path("/x/tessera") / f"kai-{revision}"
    assert install_dir(pin, {"TESSERA_CACHE": "/c"}, home) == Path("/c") / f"kai-{revision}"
    assert install_dir(pin, {DIR_ENV: "/built", "TESSERA_CACHE": "/c"}, home) == Path("/built")


def test_without_a_build_the_contender_is_skipped_with_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    assert find_kai() is None
    everything = [f"bin/{name}" for name in COMPONENTS] + ["crds", "priorityclasses", "version"]
    assert missing_parts(tmp_path) == everything
    message = skip_reason()
    assert message == skip_message(tmp_path, everything)
    assert message.startswith("KAI Scheduler contender skipped")
    assert str(tmp_path) in message and "bash hack/build-kai.sh" in message and DIR_ENV in message

    for part in everything:  # a complete build is found
        path = tmp_path / part
        path.parent.mkdir(parents=True, exist_ok=True)
        if part in ("crds", "priorityclasses"):
            path.mkdir()
        else:
            path.write_text("v0.0.0-test\n" if part == "version" else "")
    found = find_kai()
    assert found is not None and found.version == "v0.0.0-test"


def test_each_contender_once_per_round_in_alternating_order() -> None:
    assert "".join(alternating(3, "abc")) == "abccbaabc"
    assert list(alternating(2, (False, True))) == [False, True, True, False]


def test_slice_layout_tells_consumable_capacity_from_whole_devices() -> None:
    shared = {"spec": {"devices": [{"name": "gpu-0", "allowMultipleAllocations": True}]}}
    whole = {"spec": {"devices": [{"name": "gpu-0"}]}}
    assert slice_layout([whole, shared]) == "consumable capacity"
    assert slice_layout([whole]) == "whole devices"


def test_reclaim_table_has_kais_rows_and_a_round_that_never_got_there() -> None:
    plain = ReclaimRun("bench-plain", needed=16, seconds=10.0, evicted=16)
    tessera = ReclaimRun("bench-tessera", needed=16, seconds=4.0, evicted=16)
    kai = (
        ReclaimRun(KAI_SCHEDULER, needed=16, seconds=6.0, evicted=20, undone=4),
        ReclaimRun(KAI_SCHEDULER, needed=16, seconds=120.0, evicted=31, undone=15, reached=False),
    )
    result = ReclaimResult(
        (plain,),
        (tessera,),
        nodes=4,
        dra_probe="not bound",
        slices="whole devices",
        kai_runs={DEFAULT_ACTIONS.label: kai},
    )
    median, runs = result.kai[DEFAULT_ACTIONS.label]
    assert median.seconds == 6.0 and runs == kai  # the lower middle of two rounds
    table = reclaim_table(result)
    assert f"{DEFAULT_ACTIONS.label} (DRA claims)" in table
    assert "20 / 16 = 1.25" in table  # evicted / needed
    assert "4 (each round 4, 15)" in table
    assert "0.60x" in table  # KAI's 6.0 s over plain's 10.0 s
    assert "DRA slices: whole devices" in table
    assert "not in 120" in reclaim_table(ReclaimResult((plain,), (kai[1],), nodes=4, dra_probe=""))


def test_a_job_runs_the_benchmarks_pod_once_and_carries_its_queue_labels() -> None:
    pod = gpu_pod("ns", "a-00001", KAI_SCHEDULER, queue="a")
    job = as_job(pod)
    assert (job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]) == ("Job", "a-00001", "ns")
    assert (
        job["metadata"]["labels"]
        == job["spec"]["template"]["metadata"]["labels"]
        == pod["metadata"]["labels"]
    )
    assert job["spec"]["template"]["spec"] == {**pod["spec"], "restartPolicy": "Never"}
    assert job["spec"]["backoffLimit"] >= 100  # evictions count as failures; never give up in a round


async def test_bound_pods_remembers_the_deleted_ones_by_queue() -> None:
    tracker = BoundPods(bound={"a-1": "a", "b-1": "b"})
    tracker.deleted["a-1"] = tracker.bound.pop("a-1")  # what a DELETED event does
    assert tracker.per_queue() == {"b": 1} and list(tracker.deleted.values()).count("a") == 1


def test_reaction_says_faster_or_slower_than_plain() -> None:
    plain = ReactionRun("plain", 4, 0.9, 4, 4, 4)
    assert vs_plain(plain, ReactionRun("kai", 4, 2.25, 8, 3, 4)) == "2.50x slower"  # 2.25 / 0.9
    assert vs_plain(plain, ReactionRun("tessera", 4, 0.45, 3, 4, 4)) == "2.00x faster"  # 0.9 / 0.45
