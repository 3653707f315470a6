"""The FGD paper's baselines as its public simulator scores them (Weng et al., ATC'23).

Facts taken from the paper's simulator (hkust-adsl/kubernetes-scheduler-simulator), written anew:

* Scores are kube-scheduler integers in 0..100 and the node with the highest wins; the
  scheduler breaks ties deterministically by node name, and node names carry a seeded random
  prefix, so ties go to the first node of a random node order fixed for the whole run (the
  replay's ``tie_break="first"`` over nodes permuted per seed).
* **FGD**: ``int(100 * sigmoid((frag_before - frag_after) / 1000))`` where frag is the node's
  fragmentation for the *typical* task types (below). A GPU fraction tries every GPU it fits on
  and keeps the best-scoring one, the lowest device index among equal scores; whole GPUs and
  GPU-less pods are scored for the node as a whole. The integer truncation makes many nodes tie.
* **BestFit**: ``int(100 * (1 - (0.5 * cpu_left / 128 cores + 0.5 * gpu_milli_left / 8000)))``
  after placement (per-node maxima of the trace's machines); a fraction goes to the fullest GPU it
  fits on. (The score is min-max normalised across nodes, which keeps its order.)
* **Random**: a node drawn uniformly among those that fit; a fraction on a random fitting GPU.

Typical task types: the trace's distinct (CPU, per-GPU milli, GPU count, GPU models) requests,
most popular first, until they cover 95% of pods, popularity renormalised over those kept.
Memory is not part of a type (the filter still checks it). A node's fragmentation for a type:
all idle GPU milli if the type asks for no GPU, cannot use the node's model, or lacks GPUs or CPU
there; otherwise the idle milli of GPUs whose free share is below its per-GPU request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from contract.names import GPU_MILLI
from extender.policy.placement import GpuDemand

POPULARITY_THRESHOLD_PCT = 95
MAX_NODE_SCORE = 100
BEST_FIT_MAX_CPU_MILLI = 128_000
BEST_FIT_MAX_GPU_MILLI = 8_000


@dataclass(frozen=True, order=True)
class TaskType:
    """What the paper's fragmentation measure keeps of a pod's request."""

    cpu_milli: int
    milli: int  # per GPU; 0 for a pod without GPUs
    count: int
    models: str  # allowed models joined by "|", "" for any

    @classmethod
    def of(cls, demand: GpuDemand) -> TaskType:
        milli = demand.milli if demand.count else 0
        return cls(demand.cpu_milli, milli, demand.count, "|".join(sorted(demand.models)))


@dataclass(frozen=True)
class TypicalTasks:
    """Task types with their popularity (summing to 1), most popular first."""

    types: tuple[tuple[TaskType, frozenset[str], float], ...]  # (type, allowed models, popularity)


def typical_tasks(
    weighted: Sequence[tuple[GpuDemand, float]], threshold_pct: int = POPULARITY_THRESHOLD_PCT
) -> TypicalTasks:
    """Typical types of a workload given as (demand, how many pods ask for it), e.g. a mix's."""
    counts: dict[TaskType, float] = {}
    for demand, count in weighted:
        task = TaskType.of(demand)
        counts[task] = counts.get(task, 0.0) + count
    total = sum(counts.values())
    # Most popular first; among equal counts the larger request first (the simulator's order).
    ranked = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    kept: list[tuple[TaskType, float]] = []
    covered = 0.0
    for task, count in ranked:
        if covered >= threshold_pct * total / 100:
            break
        kept.append((task, count))
        covered += count
    share = covered / total
    return TypicalTasks(
        tuple((task, frozenset(task.models.split("|")) - {""}, count / total / share) for task, count in kept)
    )


# Fragmentation buckets of the paper's simulator, in its summation order (float sums must match
# for its integer scores to tie where they tie).
_LACK_BOTH, _LACK_GPU, _SATISFIED, _LACK_CPU, _CPU_TASK_FITS, _CPU_TASK_LACKS_CPU, _NO_ACCESS = range(7)


def paper_fragmentation(model: str, free: Sequence[int], cpu_free_milli: int, tasks: TypicalTasks) -> float:
    """Expected GPU milli on a node that the typical tasks cannot use (the paper's node measure)."""
    idle = sum(free)
    buckets = [0.0] * 7
    for task, models, popularity in tasks.types:
        cpu_ok = cpu_free_milli >= task.cpu_milli
        if task.milli == 0:
            buckets[_CPU_TASK_FITS if cpu_ok else _CPU_TASK_LACKS_CPU] += popularity * idle
            continue
        if models and model not in models:
            buckets[_NO_ACCESS] += popularity * idle
            continue
        if sum(1 for f in free if f >= task.milli) >= task.count:
            if cpu_ok:
                stranded = sum(f for f in free if f < task.milli)
                buckets[_LACK_GPU] += popularity * stranded
                buckets[_SATISFIED] += popularity * (idle - stranded)
            else:
                buckets[_LACK_CPU] += popularity * idle
        else:
            buckets[_LACK_GPU if cpu_ok else _LACK_BOTH] += popularity * idle
    return sum(value for bucket, value in enumerate(buckets) if bucket != _SATISFIED)


def sigmoid_score(frag_before: float, frag_after: float) -> int:
    return int(1.0 / (1.0 + math.exp(-(frag_before - frag_after) / 1000)) * MAX_NODE_SCORE)


def best_fit_score(cpu_free_milli: int, gpu_free_milli: int, demand: GpuDemand) -> int:
    left = (cpu_free_milli - demand.cpu_milli) / BEST_FIT_MAX_CPU_MILLI * 0.5
    left += (gpu_free_milli - demand.total_milli) / BEST_FIT_MAX_GPU_MILLI * 0.5
    return int((1.0 - left) * MAX_NODE_SCORE)


def whole_gpus_after(free: Sequence[int], demand: GpuDemand) -> tuple[int, ...]:
    """Free milli per GPU after ``demand`` takes the lowest-index whole free GPUs (or none)."""
    after = list(free)
    needed = demand.count
    for index, milli in enumerate(after):
        if needed == 0:
            break
        if milli == GPU_MILLI:
            after[index] = 0
            needed -= 1
    return tuple(after)
