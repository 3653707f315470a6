"""Pure parts of the scale suite (bench.scale): the percentile, the medians over rounds, the table
and its ratios, and the churn's work lost (bench.reclaim.ChurnResult), as worked examples."""

from __future__ import annotations

import pytest

from bench.e2e import FLOOR_LABEL, CpuUse, percentile
from bench.reclaim import ChurnResult, churn_table
from bench.scale import Figures, ScaleResult, ScaleRun, figures_json, scale_table


@pytest.mark.parametrize(
    ("values", "pct", "expected"),
    [
        # Nearest rank: the ceil(pct/100 * n)-th smallest.
        ([3.0, 1.0, 2.0], 50, 2.0),  # ceil(1.5) = 2nd of 1, 2, 3
        ([float(v) for v in range(1, 11)], 95, 10.0),  # ceil(9.5) = 10th of 1..10: the largest
        ([float(v) for v in range(1, 21)], 95, 19.0),  # ceil(19.0) = 19th of 1..20
        ([float(v) for v in range(1, 21)], 50, 10.0),  # ceil(10.0) = 10th
        ([7.0], 95, 7.0),  # one sample is every percentile
        ([4.0, 9.0], 0, 4.0),  # ceil(0) = 0: the smallest all the same
    ],
)
def test_percentile_is_the_nearest_rank(values: list[float], pct: float, expected: float) -> None:
    assert percentile(values, pct) == expected


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 95)


def test_a_rounds_figures() -> None:
    # 4000 jobs bound in 400 s: 10 jobs/s; reclaim samples 1, 2, 3, 10: mean 16 / 4 = 4.0, p95
    # the ceil(3.8) = 4th smallest = 10.
    run = ScaleRun("t", 4000, 400.0, reclaim_s=(1.0, 2.0, 3.0, 10.0), evicted=4)
    assert (run.jobs_per_s, run.reclaim_mean_s, run.reclaim_p95_s) == (10.0, 4.0, 10.0)


def _run(fill_s: float, reclaim: tuple[float, ...], control_plane_s: float, evicted: int = 0) -> ScaleRun:
    return ScaleRun("x", 4000, fill_s, CpuUse(100.0, 0.0, control_plane_s), reclaim, True, evicted)


def test_each_figure_is_its_own_median_over_the_rounds() -> None:
    # Three rounds: fills 400, 500, 200 s (10, 8, 20 jobs/s: median 10); reclaim means 2, 4, 3
    # (median 3); control plane CPU 90, 60, 120 s (median 90). Each figure's own median, not the
    # figures of the median round by fill (the 400 s round's reclaim mean is 2.0, not 3.0).
    figures = Figures(
        "t",
        (
            _run(400.0, (1.0, 3.0), 90.0, evicted=2),
            _run(500.0, (4.0, 4.0), 60.0, evicted=2),
            _run(200.0, (3.0, 3.0), 120.0, evicted=3),
        ),
    )
    assert figures.jobs_per_s == 10.0
    assert figures.reclaim_mean_s == 3.0
    assert figures.cpu("control_plane_s") == 90.0
    # 7 pods evicted for the 6 GPUs B got: 7 / 6.
    assert figures.evicted_per_gpu == pytest.approx(7 / 6)
    # An even count: the mean of the middle two (8 and 10 jobs/s: 9).
    assert Figures("t", figures.rounds[:2]).jobs_per_s == 9.0


def test_the_table_gives_each_contender_its_ratio_against_plain() -> None:
    # Plain fills 4000 GPUs in 500 s (8 jobs/s), cannot reclaim (one sample, its 30 s wait);
    # Tessera fills in 400 s (10 jobs/s: 1.25x), reclaims in 2 and 4 s (avg 3.0, p95 4.0), one
    # pod evicted per GPU; control plane CPU 150 s against plain's 100 (1.50x).
    plain = ScaleRun("plain", 4000, 500.0, CpuUse(200.0, 0.0, 100.0), (30.0,), reached=False)
    tessera = ScaleRun("tessera", 4000, 400.0, CpuUse(250.0, 30.0, 150.0), (2.0, 4.0), evicted=2)
    result = ScaleResult(
        500, 2, (Figures("plain kube-scheduler", (plain,)), Figures("kube-scheduler + Tessera", (tessera,)))
    )
    rows = scale_table(result).splitlines()
    assert rows[2].split() == [
        *("plain", "kube-scheduler", "500", "4000", "500.0", "(500.0)", "8.0", "1.00x"),
        *("not", "in", "30", "-", "-", "-", "200.0", "0.0", "100.0", "1.00x"),
    ]
    assert rows[3].split() == [
        *("kube-scheduler", "+", "Tessera", "500", "4000", "400.0", "(400.0)", "10.0", "1.25x"),
        *("3.0", "4.0", "-", "1.00", "250.0", "30.0", "150.0", "1.50x"),
    ]
    assert rows[4] == "Tessera / floor: not measured (--no-floor)"
    assert "13.9 s average to reclaim one GPU" in rows[5]
    assert figures_json(result) == {
        "nodes": 500,
        "jobs_per_s (plain kube-scheduler)": 8.0,
        "reclaim_avg_s (plain kube-scheduler)": -1,  # not reached
        "reclaim_p95_s (plain kube-scheduler)": -1,
        "control_plane_cpu_s (plain kube-scheduler)": 100.0,
        "jobs_per_s (kube-scheduler + Tessera)": 10.0,
        "reclaim_avg_s (kube-scheduler + Tessera)": 3.0,
        "reclaim_p95_s (kube-scheduler + Tessera)": 4.0,
        "control_plane_cpu_s (kube-scheduler + Tessera)": 150.0,
    }


def test_the_floor_is_a_contender_and_tessera_is_measured_against_it() -> None:
    # The do-nothing extender fills 4000 GPUs in 380 s (10.5 jobs/s); Tessera in 400 s (10 jobs/s):
    # 10 / 10.53 = 0.95x the floor. The floor reclaims by priority only, like plain: not reached.
    plain = ScaleRun("plain", 4000, 500.0, reclaim_s=(30.0,), reached=False)
    tessera = ScaleRun("tessera", 4000, 400.0, reclaim_s=(2.0,), evicted=1)
    floor = ScaleRun("floor", 4000, 380.0, reclaim_s=(30.0,), reached=False)
    result = ScaleResult(
        500,
        1,
        (
            Figures("plain kube-scheduler", (plain,)),
            Figures("kube-scheduler + Tessera", (tessera,)),
            Figures(FLOOR_LABEL, (floor,)),
        ),
    )
    assert result.vs_floor == pytest.approx(0.95)
    rows = scale_table(result).splitlines()
    assert rows[4].split()[:9] == [*FLOOR_LABEL.split(), "500", "4000", "380.0", "(380.0)", "10.5"]
    assert rows[5].startswith("Tessera / floor, fill: 0.95x (kube-scheduler + do-nothing extender")
    assert figures_json(result)["tessera_vs_floor"] == 0.95


def test_a_reclaim_plain_reached_gets_its_ratio() -> None:
    # Plain reclaims in 8 s, Tessera in 2 s: 0.25x plain's time.
    plain = ScaleRun("plain", 40, 2.0, reclaim_s=(8.0,))
    tessera = ScaleRun("tessera", 40, 2.0, reclaim_s=(2.0,), evicted=1)
    result = ScaleResult(5, 1, (Figures("plain kube-scheduler", (plain,)), Figures("Tessera", (tessera,))))
    assert scale_table(result).splitlines()[3].split()[7:11] == ["2.0", "2.0", "0.25x", "1.00"]


def test_the_churns_work_lost_is_a_share_of_the_gpu_time_used() -> None:
    # Evicted pods had run 30 GPU-s, finished ones 270: 30 / (30 + 270) = 10.0%.
    churn = ChurnResult("Tessera", 60.0, 3, 100, 40, 5, 0, 1, 1.0, lost_gpu_s=30.0, done_gpu_s=270.0)
    assert churn.lost_pct == 10.0
    # KAI's events do not tell what a plan needed: its ratio reads "-".
    kai = ChurnResult("KAI", 60.0, 3, 100, 40, 6, 1, 2, None, lost_gpu_s=60.0, done_gpu_s=240.0)
    tessera_row, kai_row = churn_table([churn, kai]).splitlines()[2:4]
    # max plan ratio, work lost, per eviction: 30 GPU-s over 5 evictions = 6.0 s each.
    assert tessera_row.split()[-4:] == ["1.00", "30", "(10.0%)", "6.0"]
    assert kai_row.split()[-4:] == ["-", "60", "(20.0%)", "10.0"]
    assert ChurnResult("Tessera", 1.0, 3, 0, 0, 0, 0, 0, 0.0).lost_pct == 0.0  # nothing ran: no share


def test_a_churn_from_a_full_cluster_counts_the_base_s_time_and_the_churn_pods_waits() -> None:
    # The base's pods still running at the end held 9700 GPU-s of the churn: used is
    # 30 + 270 + 9700 = 10000, so the 30 GPU-s lost are 0.3%. Of 4 evictions 3 were the base's.
    # The churn pods' waits 1, 2, 3, 10 s: p50 is the 2nd smallest (2.0), p95 the 4th (10.0).
    churn = ChurnResult(
        "Tessera",
        60.0,
        3,
        100,
        40,
        4,
        0,
        0,
        1.0,
        actions="",
        lost_gpu_s=30.0,
        done_gpu_s=270.0,
        held_gpu_s=9700.0,
        waits_s=(3.0, 1.0, 10.0, 2.0),
        base_evictions=3,
    )
    assert churn.lost_pct == 0.3
    assert (churn.wait_s(50), churn.wait_s(95)) == (2.0, 10.0)
    row = churn_table([churn]).splitlines()[2].split()
    assert row[5:9] == ["4", "(3", "of", "the"]  # evictions, of them the base's
    assert row[-6:-4] == ["/", "10.0"]  # wait p50 / p95
    assert ChurnResult("KAI", 1.0, 3, 0, 0, 0, 0, 0, None).wait_s(95) == 0.0  # no pod bound: no wait
