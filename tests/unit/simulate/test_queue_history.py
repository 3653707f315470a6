"""Fair share over time in the queue replay: the week-long example with history on and off."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from extender.rule_flags import RuleFlags
from tessera.simulate.cli import main
from tessera.simulate.queues import QueueRunResult, load_workload, parse_workload, run_queue_workload

EXAMPLES = Path(__file__).resolve().parents[3] / "tessera" / "simulate" / "examples"


def _hours(result: QueueRunResult) -> dict[str, float]:
    return {q.name: q.gpu_hours for q in result.queues}


def _shares(history: bool, example: str = "history-week.yaml") -> dict[str, float]:
    result = run_queue_workload(load_workload(EXAMPLES / example), history=history)
    total = sum(q.gpu_hours for q in result.queues)
    return {q.name: q.gpu_hours / total for q in result.queues}


def test_a_week_of_whole_node_jobs_ends_near_the_weights_with_history() -> None:
    # Equal weights, so 50 % each is the target. Off: the steady team's older backlog wins every
    # tie: 1920 of 2688 GPU-hours (71.4 %), the nightly team 768 (28.6 %). On: 1408 and 1280
    # (52.4 %, 47.6 %): each within 5 % of its weight, with no eviction (min runtime 2 h).
    on, off = _shares(True), _shares(False)
    assert off["nightly"] == pytest.approx(768 / 2688)
    for queue in ("steady", "nightly"):
        assert abs(on[queue] - 0.5) <= 0.05 * 0.5
    assert on["nightly"] > off["nightly"] + 0.15


def test_a_newcomer_runs_with_history_and_never_without() -> None:
    # Off: 0 of 2688 GPU-hours (its pods are younger than every backlog). On: 512 (19.0 %) in
    # the three days it is there.
    assert _shares(False, "history-newcomer.yaml")["newcomer"] == 0
    assert _shares(True, "history-newcomer.yaml")["newcomer"] == pytest.approx(512 / 2688)


@pytest.mark.parametrize(
    ("example", "head_start_gpu_h"),
    [
        # Jobs of 3 h, steady every 2 h, nightly 6 at 22:00 (half-life 24 h, kValue 1): the
        # steady team holds the node alone for the first 22 h, 22 * 16 = 352 GPU-hours.
        ("history-week-3h.yaml", 352),
        # history-week's jobs, half-life 12 h and kValue 2: alone for 20 h, 320 GPU-hours.
        ("history-week-12h.yaml", 320),
    ],
)
def test_held_out_weeks_miss_the_weights_by_a_head_start_the_half_life_forgets(
    example: str, head_start_gpu_h: float
) -> None:
    # 7 days of one 16-GPU node: 2688 GPU-hours, 50 % is 1344. As shipped, nightly ends with
    # 1248 (46.4 %, 7.2 % below its weight), although from its first job on it gets more than
    # half of the node: 1248 / (2688 - head start) = 53.4 % and 52.7 %. The head start decays
    # (a half-life of 12-24 h forgets it in a day or two) before it is paid back. With no
    # half-life (KAI's default, the whole week counts) the same week ends at 1344 / 1344.
    data = yaml.safe_load((EXAMPLES / example).read_text())
    decayed = _hours(run_queue_workload(parse_workload(data)))
    assert decayed["nightly"] == pytest.approx(1248)
    assert decayed["nightly"] / (2688 - head_start_gpu_h) > 0.5
    data["fairShareHistory"].pop("halfLife")
    undecayed = _hours(run_queue_workload(parse_workload(data)))
    assert undecayed == pytest.approx({"steady": 1344, "nightly": 1344})


def test_history_alone_causes_no_eviction_storm_without_a_min_runtime() -> None:
    # history-week without reclaimMinRuntime, and rule 9's wait set to 0 (a queue owed part of a
    # pod reclaims at once). Whoever holds the node accumulates usage, so the history-weighted
    # shares cross every cycle or two: the waiting queue is owed 8 + x of 16 (part of its
    # whole-node pod). Before the wait was closed under history: 814 evictions in a week, 81 % of
    # the GPU time thrown away. Now: none, and GPU-hours still 1408 / 1280 (52.4 % / 47.6 %).
    data = yaml.safe_load((EXAMPLES / "history-week.yaml").read_text())
    for queue in data["queues"]:
        queue["spec"].pop("reclaimMinRuntime")
    result = run_queue_workload(parse_workload(data), flags=RuleFlags(partly_owed_wait_s=0))
    total = sum(q.gpu_hours for q in result.queues)
    assert result.evictions == []
    for queue in result.queues:
        assert abs(queue.gpu_hours / total - 0.5) <= 0.05 * 0.5


def test_history_off_is_todays_replay() -> None:
    # A workload without history replays alike with history forced off: the same numbers.
    workload = load_workload(EXAMPLES / "two-teams.yaml")
    plain, off = run_queue_workload(workload), run_queue_workload(workload, history=False)
    assert plain.queues == off.queues and plain.evictions == off.evictions
    assert not plain.history


def test_the_run_ends_at_until() -> None:
    data = {
        "until": 100,
        "nodes": [{"name": "n", "gpus": 2}],
        "queues": [{"name": "a"}],
        "jobs": [{"name": "j", "queue": "a", "count": 3, "duration": 60, "gpus": 2}],
    }
    result = run_queue_workload(parse_workload(data))
    # 2 GPUs for the 100 s: the first pod's 60 s and 40 s of the second.
    assert result.makespan_s == 100
    assert result.queues[0].gpu_hours == pytest.approx(2 * 100 / 3600)


def test_a_bad_history_section_is_refused() -> None:
    workload = {
        "nodes": [{"name": "n", "gpus": 1}],
        "queues": [{"name": "a"}],
        "jobs": [{"name": "j", "queue": "a", "duration": 1}],
    }
    with pytest.raises(ValueError, match="kValue"):
        parse_workload({**workload, "fairShareHistory": {"kValue": -1}})
    with pytest.raises(ValueError, match="fairShareHistory"):
        parse_workload(
            {**workload, "queues": [{"name": "a", "spec": {"fairShareHistory": {"window": "0s"}}}]}
        )
    assert replace(parse_workload(workload)).history.enabled is False


def test_the_cli_prints_gpu_hours_against_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["queues", str(EXAMPLES / "two-teams.yaml"), "--history", "on", "--no-plots", "--out", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "fair share over time on:" in out and "% of weight" in out
