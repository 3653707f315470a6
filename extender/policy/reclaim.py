"""Reclaim and preemption planning: which running pods to evict so a waiting pod fits. Pure.

Goals (design-next.md, "one planner, three goals"); this module serves two of them:

* **reclaim** - a queue below its fair share has a pending pod that fits no node: evict borrowed,
  preemptible pods of queues above their fair share until it fits;
* **preempt** - a pod that does not fit, in a queue within its fair share, evicts lower-priority
  preemptible pods of its own queue.

Rules (each a test in tests/unit/extender/test_reclaim.py):

1. Every reclaim makes things fairer, in whole pods. A queue's surplus is what its subtree holds
   minus its fair share (negative: it is owed). Queues are compared where their paths in the
   tree diverge: for a reclaimer R and a victim's queue V below their lowest common ancestor, R'
   and V' are the children of that ancestor on each path (the roots when they share none). A
   pod of R asking r GPUs may take the t GPUs of a victim when every queue from R up to R' is
   owed, every queue from V up to V' has a surplus, and

   (a) each of those ends, t GPUs poorer, owed less than the most owed queue from R up to R' is
       now: surplus(X) - t > m = min surplus(Y) over Y from R to R', for X from V to V';
   (b) V' ends no more owed than R' is now: surplus(V') - t >= surplus(R') - never inverted
       where the paths diverge; an exact swap there is allowed, when a queue below R' is owed
       more than R' is.

   Why (a potential that every reclaim raises): with r = t the move changes the surpluses of
   exactly the queues from R up to R' (each r up) and from V up to V' (each t down); the common
   ancestors and every other queue stay, and so do the fair shares (a move changes no queue's
   demand, the victims waiting again as their controllers recreate them). Before the move the
   lowest of the changed surpluses is m (the victim's side has surpluses, the reclaimer's is
   owed); after it the reclaimer's side is above where it was and the victim's side above m by
   (a), so the lowest changed surplus rises. Then the surpluses of all queues, sorted ascending,
   grow lexicographically: the entries below m are untouched, one entry at m is gone and none
   joins at or below it. Holdings move in whole pods, so that vector takes finitely many values
   and no sequence of reclaims can come back to where it started (no ping-pong, not only no
   immediate reversal; `test_no_sequence_of_reclaims_comes_back_to_where_it_started` replays
   random moves the rule allows and checks the vector rises at every one). Comparing after the
   move with before it ("less owed than ... is now") is what lets a whole pod move although fair
   shares are fractional; the strict "less" refuses a swap that only changes who is owed (its
   reverse would be allowed by the same numbers). (b) adds no freedom, it keeps the order of the
   subtrees where the paths diverge: a department never ends more owed than the reclaimer's
   department was, however owed a leaf inside it.

   Where R is R' (a leaf right below the common ancestor: every pair in a flat tree) m is
   surplus(R'), (b) follows from (a), and the rule is the one it replaces ("owed less than R' is
   now"). They differ in a hierarchy, for a leaf owed a whole pod in a department owed less than
   one: on `churn` at t=23003 dept-b was at 23.5 of 24 and its leaf b4 at 3 of 4; a GPU from
   dept-a, at 24.5 of 24, leaves dept-a as owed as dept-b was, which the old rule refused (no
   fairer where the paths diverge), though the most owed queue moved, b4 at -1, ends at its
   share and nothing ends owed more than 0.5. Now that swap of the departments goes.

   Worked examples (tests/unit/extender/test_reclaim.py):

   * 4 GPUs; a and b hold 2 each and want more, c holds 0 and wants 1: shares 1.5 / 1.5 / 1. c is
     owed 1; a (surplus 0.5) gives one GPU and ends 0.5 owed (1 of 1.5), less than c's 1: c is
     served. Next cycle a (owed 0.5) may take neither from b (0.5 above: it would end owed 0.5,
     a swap) nor from c (at its share). The rule it replaces - "the victim stays at or above its
     fair share" - refused both victims (2 - 1 < 1.5), and c waited for a pod to finish.
   * The newcomer among n queues holding k GPUs each (all wanting more): shares nk/(n+1), above
     k - 1 when k <= n, so the old rule evicted nothing. Now each victim ends nk/(n+1) - (k - 1)
     owed, less than the newcomer's nk/(n+1), as long as the newcomer is owed more than that
     (n = k = 3: shares 2.25; the newcomer takes two GPUs, from two queues, each ending 0.25
     owed; at 2 of 2.25 it would leave a third queue as owed as itself: it stops).
   * A hierarchy: 4 GPUs, org (a, b) and c at the root; c wants 1: shares org 3 (a 1.5, b 1.5),
     c 1. c and a diverge at the root: org holds 4 of 3 and ends at its share, a ends 0.5 owed,
     both less owed than c (1): a's pod goes. Then a (owed 0.5) diverges from c at the root,
     where org is owed nothing: nothing from outside org; inside org, b would end as owed as a.
   * A queue owed less than a pod: a at 1 of 1.5 wanting a GPU takes it from a queue at 2.5 of
     1.5 (that ends at its share, 0 owed < 0.5), not from one at 2 of 1.5 (a swap) - once rule 9
     lets it reclaim at all.

   * Two departments (4 GPUs each, leaves 2 each): b1 at 1 of 2 in dept-b at 3.5 of 4, a1 at 3 of
     2 in dept-a at 4.5 of 4. a1's GPU leaves dept-a 0.5 owed, as owed as dept-b is now (b: a
     swap, allowed), a1 at its share and b1 too, every end above b1's -1 (a): b1's pod goes.
     A 2-GPU victim for a b1 owed 2 would leave dept-a 1.5 owed, less than b1's 2 but more than
     dept-b's 0.5: inverted (b), refused.

   So where R' is owed at least the pod's r GPUs, any victim of no more than r GPUs whose queues
   up to V' are above their shares may go (surplus(X) - t > -t >= -r >= surplus(R'), (a) and
   (b)): a queue owed a whole pod in a subtree owed a whole pod too (what the simulator's "below
   fair s" counts of a leaf) is served from any borrower. A leaf owed a pod in a department owed
   less is served from any borrower of its department, and from another department that ends no
   more owed than its own is; one owed less than the pod takes only from a queue further above
   its share than the pod's size.
2. Victims are running, preemptible, not already terminating, and have run at least their
   queue's `reclaimMinRuntime` (reclaim) or `preemptMinRuntime` (preempt).
3. On each node, victims are taken lowest priority first, then newest, until the pod fits; then
   any victim the pod does not need after all is given back. The node needing the fewest evicted
   GPUs wins (then fewer pods, then lower priorities).
4. Never more than needed: GPUs evicted / GPUs needed <= `max_ratio` (1.1), unless a single
   victim no bigger than the whole GPUs the pod needs is evicted (a whole-GPU pod for a half-GPU
   pod: no smaller eviction exists); and at most `max_evictions` pods per cycle.
6. Bounded time, per queue and per cycle, never by a window of the oldest pods: waiting pods are
   taken queue by queue, the most owed first (`FairnessSnapshot.order`), of each queue its head
   (highest priority, then oldest) - at most `max_pending_per_queue` pods or gangs that may
   reclaim now (rules 9 and 13) and as many that may not, a gang's waiting members together -
   and at most `max_pending` pods or gangs in all (`serving_order`); for each the `node_trials`
   nodes holding possible victims with the most free GPU; and a work budget per cycle (`Budget`:
   `max_trials` node searches in all), after which the remaining waiting pods are not tried. So
   a queue below its share is planned in the first cycle after its pod fails to fit, whatever
   other queues' backlogs. What is cut off waits for a later cycle and is counted in the budget,
   which the controller reports (metric
   and log). A node searched whose GPUs rule out a plan within the
   cycle's evictions left (`fewest_evictions`, a lower bound on the pods to evict there) costs
   its trial but no trial evictions.
5. Every plan is applied to a fork of the snapshot (victims off, pod placed) before the next one
   is made, so one cycle's plans never count the same GPUs twice. The live picture is untouched.

8. An evicted pod is not the next plan's victim: a pod restarted after an eviction is spared
   for `recent_victim_s` (60 s) after its restart (`protected_restarts`), so one pod does not
   lose its work to plan after plan while others that ran longer are left. The simulator knows
   each pod's evictions; live, the reclaim loop remembers the controllers (owner uid) of the pods
   it evicted, for an hour, and spares their pods that started after the eviction (all of that
   owner's pods started since: a Job's other pods too - a coarse but safe approximation).
9. A queue owed less than the pod waits for capacity to free. A pod whose queue holds less than
   its fair share by less than the pod's own request (on a GPU resource it asks for) reclaims
   only once it has waited `partly_owed_wait_s` (default: never); meanwhile GPUs that free go to
   it first, where it fits (`extender.policy.deference`: it is owed). A queue owed a whole pod
   reclaims at once. Why: moving one whole pod to a queue owed a fraction of it is a small step
   towards max-min fairness (rule 1) bought with all the work the victim did, and on a loaded
   cluster a GPU frees by itself within seconds. Measured (docs/queues.md, "No churn"): on 48
   GPUs with 12 queues, half the evictions were of this kind; a finite wait (300 s) made it worse
   (17.7% of the GPU time lost instead of 15.3%: the victims chosen later had run longer), no
   reclaim for them made it better (12.3%), and the time queues spent owed a whole pod fell.
   Example: 5 GPUs, a, b, c sharing them (1.67 each), a holds 3, b and c 1 each and want more.
   b is owed 0.67, less than its 1-GPU pod: nothing is evicted (before: one of a's pods, 10 s
   into its run); when one of a's pods ends, a's waiting pod defers and b's takes the GPU.
   For a queue whose share fair share over time moves (`Rules.history_moves`: the rule is on
   for a queue of its level or of an ancestor's level) the wait never opens, whatever it is set
   to: history moves the shares by itself (the queue holding the capacity accumulates usage, its
   share falls), so a partial deficit changes sides as soon as a pod moves, and reclaiming on it
   hands the same capacity back and forth (one 16-GPU node of whole-node jobs, a wait of 0:
   814 evictions in a week). A whole pod's deficit only comes back after history has moved the
   shares by a whole pod (docs/queues.md, "Fair share over time"). Queues whose shares history
   does not move keep the wait they are given.
7. Holds name the GPUs freed. Applying a plan places its pod on the node it made room on, on the
   GPUs the filter's placement chooses there, and the plan holds exactly those devices for it
   (`HeldGpus`: node, GPU indexes, the share of each). A pod placed later in the cycle on shares a plan freed
   and its pod did not take rides on that plan (`Served`): the plan holds those devices for it
   too and counts its GPUs as needed - provided its queue could have had a plan of its own.
   Example: `a` borrowed all 4 GPUs of a node, `b` (share 2) waits with 4 half-GPU pods. The
   first plan evicts one of `a`'s pods (1 GPU) for `b-0`, which takes half of that GPU; `b-1`
   takes the other half, riding: 1 GPU evicted for 0.5 + 0.5 needed. The second plan does the
   same for `b-2` and `b-3`: 2 evictions for 2 GPUs needed, every plan at ratio 1.0. (Without
   the devices, holds of "half a GPU somewhere on the node" were packed onto one GPU, the other
   freed GPU went whole to `a`'s evicted pod, and a third eviction - of that same pod - followed.)

10. A pod short of CPU or memory (DRF, `extender.policy.drf`). A pod that neither a GPU reclaim
   nor preemption serves, and that fits the free GPUs of a node but not its free CPU or memory
   (`host_starved`), may take victims on such a node from queues above their dominant share -
   the largest of what a queue holds over its fair share, per resource (GPUs, cores, bytes) -
   when its own queue is below its dominant share (below its fair share of every resource),
   stays within its GPU share and has its dominant share raised by the pod, and the victims'
   queues end above where the reclaimer's is (never inverts, in dominant shares; within its GPU
   share, the reclaimer is no victim of rule 1: the two rules do not undo each other). Such a
   plan frees CPU or memory, so rule 4's
   GPU ratio does not bound it; rule 3 gives back every victim it does not need. Plans of goal
   `drf`. Example: 8 GPUs, 64 cores; a's 4 pods of <1 GPU, 16 cores> hold every core at GPU
   shares 4 / 4 (a at 4 of 4 GPUs, 64 of 48 cores: dominant share 1.33); b's pod of <1 GPU,
   2 cores> takes one of them (a ends at 1, b was at 0).

11. The rest of a freed GPU is kept for its queue. When the cycle ends, a share a plan freed on a
   GPU its own pods share and no pod took is kept for the plan's queue - any pod of it
   (`Plan.rests`, `HeldGpus.for_queue`) - for the hold's lifetime; the planning fork places it
   like a pod's hold, and a waiting fraction of that queue goes there first (`take_rest`), with
   no plan. So a lone quarter's plan, one whole GPU (rule 4's exception), serves the queue's next
   quarters too, arriving in later cycles, and they count as needed by it (the simulator measures
   so). Example: `a` borrowed 4 GPUs, `b` waits with one quarter: `a3` goes, 0.75 of its GPU is
   kept for `b`; `b`'s next quarter, a cycle later, takes it with no eviction (before: `a2` went,
   a second whole GPU for a quarter); `c`'s quarter may not.

12. A hold another pod took is let go, and its pod planned again at once. A pod bound by another
   scheduler (it sees no holds), or any pod the hold is not for, may land on GPUs a plan freed
   and holds. Each cycle, the holds whose node has no room left for their pod - terminating
   pods and pods just evicted gone, shares held by claims of no pod on the node free (a held
   pod's claim allocated before its bind is seen, a victim's left a moment after it is gone) -
   are lost (`lost_holds`): the reclaim loop lets them go
   before it lists the waiting pods, so the pod is listed and planned again in the same cycle,
   on GPUs free or freed. A gang keeps the holds that stand, and only its members left without
   GPUs are listed (`extender.policy.admission.waiting_list`) and planned, all or none, inside
   the topology domain of its held members; its missing members are served whole again before
   the filter admits it, so it never starts partly placed (before: the gang was not listed
   while any member was held, and waited the hold's 90 s with 3 of 4 members' GPUs idle).
   A hold whose GPUs went to another held pod of the same node is placed on the node's other
   free GPUs instead, as the filter keeps it: it is not lost.

13. A queue owed a whole pod may wait for capacity to free (`whole_owed_wait_over`). A pod whose
   queue is owed at least the pod reclaims once it has waited `whole_owed_wait_s` (default 0: at
   once); meanwhile GPUs that free where it fits go to it first (`extender.policy.deference`), so a
   pod that capacity freeing by itself serves within the wait costs no victim its work. The wait
   counts in the 60 s within which a queue owed a pod is served: keep it below 60 s less a
   reclaim cycle and the victims' termination time. Example (FAIRER[0] of the tests): 4 GPUs, a
   and b hold 2 each, c holds 0 of its share 1 and asks 1; with a 20 s wait nothing is evicted
   at 0 s or 19 s, a1 at 20 s (before: at once). Measured (docs/queues.md, "No churn"): on
   `churn` at 0 s a 20 s wait cut work lost from 10.8% to 10.3% and a 40 s one to 9.3%, but the
   time queues spent owed a pod rose by about half; with a 30 s termination, 20 s cut it from
   11.6% to 9.4% with that time unchanged, but 25 s only to 11.3%. Most work is lost serving 2-
   and 4-GPU pods, which a single GPU freeing by itself does not fit, so the default stays 0.

14. A victim budget (`spent_victims`; off by default). With `max_victim_evictions` K above 0, a
   pod evicted K times already is no victim again: no pod loses its work more than K times
   however often plans look at its node. An evicted pod comes back as another pod (its
   controller's replacement), so the count belongs to the replica, not the pod object: the
   replacement of an evicted pod inherits its count (the simulator's pod keeps its identity;
   live, the reclaim loop's `ReplicaCounts`). Example: K = 3; a0 evicted 3 times, a1 twice, both
   on the only node with a borrower's GPUs: a1 goes, a0 stays (before: a0, the newest, went a
   fourth time). Measured (docs/queues.md, "Rules 14 and 15, measured"): at K = 3 no pod is
   evicted more than 3 times on six churn runs, the work lost falls by 0.1-2.1 points only, and
   the worst queue's time below its share grows on three of them - the spared pod's work is paid
   for by an older victim or by the owed queue's wait.

15. A victim lead (`lead_within`; off by default). With `victim_lead_s` L finite, reclaim takes
   only victims that started at most L before the pod it serves began to wait (its
   `waiting_since`), the lead growing by `victim_lead_per_wait` g per second waited: a victim
   then loses at most L + (1 + g) times the wait. Pods that started while the pod waited -
   capacity that freed where the owed pod did not fit and a borrower took - are always victims;
   an old pod is taken, with g > 0, only once the pod has waited (r - L) / g for a victim that
   had run r when the wait began (rent or buy: the wait pays for the work thrown away); with
   g = 0, never - the pod waits for capacity to free, which deference hands to it first. Not
   for preemption within a queue. Example (tests/unit/extender/test_victim_budget.py): c0
   waits since NOW - 40; a1 started at NOW - 99, 59 s before the wait: a victim with L = 60,
   none with L = 0 (with g = 1: once c0 has waited 59 s). Measured (docs/queues.md, "Rules 14
   and 15, measured"): L = 60 s cuts the work lost on six churn runs from 10.8-15.3% to
   3.1-6.1%, but the queues' total time below their shares grows 1.5-2.8 times: off by default.

16. Patience beyond the ratio (off by default). With `ratio_after_s` P finite, a whole-GPU pod
   of a queue that may reclaim now (owed a whole pod; rule 9's wait over) that has waited P
   with no plan within rule 4's ratio for any goal takes the smallest plan beyond it: the
   fewest GPUs evicted, then the least work lost - rule 1 is still checked for every victim
   (a fraction keeps rule 4's bound). What the
   served pod does not take is free for the most owed queue (`extender.policy.deference`). Why:
   on a loaded cluster the borrowers' pods on a node are often all bigger than the owed pod (a
   2-GPU borrower for a 1-GPU pod), and rule 4 then leaves the owed queue waiting for capacity to
   free by itself, minutes at load ~1.0. Example (tests/unit/extender/test_reclaim.py,
   BEYOND_RATIO): 4 GPUs borrowed by a's two 2-GPU pods, b owed 2 waits with two 1-GPU pods;
   with P = 30 nothing goes until b0 has waited 30 s, then a1 (the newer) goes for b0 and b1
   takes the other GPU it frees; a 1-GPU victim elsewhere would go first.

Pods with a `terminating` flag are evicted in the fork first: their GPUs are already coming free,
so nothing is evicted for a pod that will fit once they are gone. Pods GPUs are held for (the
snapshot's `holds`) are then placed on exactly those GPUs: they count as their queues' and take
those devices, so a later cycle neither gives them to another pod nor frees more for the same pod.

Workloads are the unit (extender.policy.workloads). A running member of a gang beyond its
workload's minimum is elastic: it goes alone, and before any other candidate on the node. A member
at the minimum goes only with its whole gang, on every node (`ClusterSnapshot.unit_of`): rules 1
and 2 are checked for the gang as one victim (all members eligible; rule 1 with t all the GPUs
of its members), and rule 4 counts all the GPUs it frees. So no plan leaves a
gang below its minimum, and a gang is broken up for nobody whose need is much smaller. A waiting
gang is served as one: its missing members are planned one after the other on a trial fork (each
by rule 1 with the ones before placed), and the plans stand only if every member fits; otherwise
nothing is evicted for any of them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from contract.names import GPU_MILLI
from extender.policy.drf import diverging_paths, drf_refusal, drf_victim_text, gpu_amounts, host_starved
from extender.policy.fairness import EPSILON, FairnessSnapshot, Resources, format_amount, has_quota
from extender.policy.placement import DomainMap, GpuDemand, NodeGpus, fits
from extender.policy.snapshot import ClusterSnapshot, HeldGpus, RunningPod, changed_keys

Goal = Literal["reclaim", "preempt", "drf"]  # drf: rule 10, a reclaim for a pod short of CPU or memory


@dataclass(frozen=True)
class PendingPod:
    """A pod waiting for GPUs, as the planner sees it."""

    key: str
    queue: str
    demand: GpuDemand  # sized for the largest GPU it could land on
    resources: Resources  # its fairness vector
    priority: int = 0
    created: float = 0.0  # seconds since the epoch
    # A fraction asks for bytes of a GPU's memory: its share depends on the node's GPU size.
    fraction_memory: int | None = None
    preemptible: bool = True  # admission lets it use more than its queue's quota
    # A member of a gang still to be admitted: served with the workload's other waiting members,
    # all of them or none ("": a pod served alone).
    workload: str = ""
    # Since when it waits (None: since `created`); a pod recreated after an eviction waits anew.
    waiting_since: float | None = None
    # A gang with a required topology level: node -> its domain at that level; the gang is
    # served inside one domain (`_plan_gang`). None: anywhere. Of a gang whose parts ask
    # different levels, its own part's level, and `outer` the widest of the parts' levels: the
    # parts with a level are served inside one domain of it, each inside one of its own.
    domains: DomainMap | None = None
    outer: DomainMap | None = None
    part: str = ""  # its part (subgroup) of the gang ("": none)

    def demand_on(self, gpu_memory: int) -> GpuDemand:
        if self.fraction_memory is None or gpu_memory <= 0:
            return self.demand
        milli = max(1, min(GPU_MILLI, math.ceil(GPU_MILLI * self.fraction_memory / gpu_memory)))
        return GpuDemand(1, milli, self.demand.models, self.demand.cpu_milli, self.demand.memory_mib)


@dataclass(frozen=True)
class Rules:
    reclaim_min_runtime_s: Mapping[str, float] = field(default_factory=dict)  # victim queue -> s
    preempt_min_runtime_s: Mapping[str, float] = field(default_factory=dict)
    max_ratio: float = 1.1
    max_evictions: int = 16  # pods per cycle
    # Waiting pods considered per cycle (`serving_order`): of each queue its head, at most this
    # many pods or gangs; of all queues, most owed first, at most `max_pending` pods or gangs.
    max_pending_per_queue: int = 16
    max_pending: int = 1024
    # Nodes searched for victims per pending pod: those with possible victims, most free first.
    node_trials: int = 16
    # Node searches per cycle, all pending pods together (the cycle's work budget, see `Budget`).
    max_trials: int = 128
    # A pod restarted after an eviction is no victim for this long after its restart (rule 8).
    recent_victim_s: float = 60.0
    # A pod of a queue owed less than the pod itself reclaims only once it has waited this long
    # (rule 9); until then capacity that frees reaches it first (`extender.policy.deference`).
    partly_owed_wait_s: float = math.inf
    # A pod of a queue owed a whole pod reclaims only once it has waited this long (rule 13);
    # until then capacity that frees reaches it first. Kept below the 60 s service target less a
    # cycle and the victims' termination (docs/queues.md, "No churn").
    whole_owed_wait_s: float = 0.0
    # The queues whose fair shares fair share over time moves (`extender.policy.history`,
    # `history_moves`): their shares drift by themselves, so rule 9's wait never opens for them
    # and only a whole pod's deficit reclaims.
    history_moves: frozenset[str] = frozenset()
    # A pod (its replica: a replacement inherits the count) evicted this many times is no victim
    # again (rule 14); 0: no budget.
    max_victim_evictions: int = 0
    # A reclaim victim started at most this long before the pod it is evicted for began to wait
    # (rule 15): the work it loses is at most this plus that wait. inf: any victim.
    victim_lead_s: float = math.inf
    # ... and the lead grows by this much per second the pod has waited (rule 15): a victim that
    # had run r when the pod began to wait is taken once it has waited (r - lead) / this.
    victim_lead_per_wait: float = 0.0
    # A pod of a queue owed a whole pod that has waited this long with no plan within
    # `max_ratio` may take the smallest plan beyond it (rule 16). inf: never.
    ratio_after_s: float = math.inf

    def partly_owed_wait_for(self, queue: str) -> float:
        """Rule 9's wait as it applies to a pod of `queue`: never while history moves its share."""
        return math.inf if queue in self.history_moves else self.partly_owed_wait_s


@dataclass
class Budget:
    """The work one planning cycle may still do, in trials (a node searched for victims, a set of
    movers tried), and the waiting pods it left untried when it ran out.

    A work budget rather than a clock, so a plan is the same on a fast and on a busy machine; the
    defaults keep a cycle well under 100 ms at 5000 nodes (docs/benchmarks.md, section 8)."""

    trials: int
    cut_off: int = 0  # waiting pods not tried (or not tried to the end) for lack of budget
    refused: int = 0  # trials asked for when none was left

    def spend(self) -> bool:
        """Take one trial; False when none is left."""
        if self.trials <= 0:
            self.refused += 1
            return False
        self.trials -= 1
        return True


@dataclass(frozen=True)
class Eviction:
    pod: RunningPod
    message: str  # names the queues and the numbers, for the victim's event


@dataclass(frozen=True)
class Plan:
    goal: Goal
    pod: PendingPod
    node: str
    evictions: tuple[Eviction, ...]
    gpus_needed: float  # by the pods it serves: `pod`, and those riding on what it frees
    gpus_evicted: float
    # The GPUs it keeps for the pods it serves, each naming its devices: `pod`'s first, then the
    # pods of the cycle placed on what it freed that `pod` did not take (rule 7). Empty until
    # the plan is applied to a fork (`apply_plan`).
    holds: tuple[HeldGpus, ...] = ()
    # The rest of each GPU it freed that its pods share and leave partly free, kept for its
    # queue's next fractions (rule 11); set when the cycle's planning ends.
    rests: tuple[HeldGpus, ...] = ()

    @property
    def ratio(self) -> float:
        return self.gpus_evicted / self.gpus_needed if self.gpus_needed > 0 else math.inf

    @property
    def served(self) -> tuple[str, ...]:
        """The keys of the pods it serves."""
        return tuple(hold.key for hold in self.holds) or (self.pod.key,)


def reclaim_refusal(
    fairness: FairnessSnapshot,
    reclaimer: str,
    request: Resources,
    victim: str,
    taken: Resources,
    *,
    starting: bool = False,
) -> str:
    """Why a pod of `reclaimer` asking `request` may not take `taken` from a pod of `victim`
    ('' when it may): rule 1 of the module docstring, on the GPU resources the pod asks for.
    `starting`: the victim's pod does not run yet, `fairness` does not count it - would reclaim
    take it back once it started? (`extender.policy.deference`: then it defers.)

    With R' and V' the queues where the two paths diverge: every queue from the reclaimer up to
    R' is below its fair share (owed); every queue from the victim's up to V' is above its own,
    and ends, `taken` poorer, less owed than the most owed queue from the reclaimer up to R' is
    now, and V' no more owed than R' is now. Worked examples in the module docstring.

    A running pod also holds its GPU model's resource (`gpu/<model>`), which a pending pod that
    takes any model does not ask for; the victim's share of that resource is no reason to keep
    GPUs from such a pod (the victim queue may be the only one holding the model, so its share
    of it is all it holds)."""
    wanted = gpu_amounts(request)
    freed = {r: a for r, a in gpu_amounts(taken).items() if r in wanted}
    if reclaimer == victim or reclaimer not in fairness.tree.specs or victim not in fairness.tree.specs:
        return "reclaim is between queues"
    up_reclaimer, up_victim = diverging_paths(fairness.tree, reclaimer, victim)
    tree, shares = fairness.tree, fairness.fair_shares

    def standing(queue: str, resource: str) -> tuple[float, float]:
        return tree.subtree(queue, "allocated", resource), shares.get(queue, {}).get(resource, 0.0)

    for queue in up_reclaimer:
        for resource in wanted:
            held, fair = standing(queue, resource)
            if held >= fair - EPSILON:
                return (
                    f"queue '{queue}' is not below its fair share ({resource} "
                    f"{format_amount(resource, held)} of {format_amount(resource, fair)})"
                )
    diverging = up_reclaimer[-1]  # R'
    for resource, amount in freed.items():
        # The most owed queue from the reclaimer up to R' (the first on ties: the reclaimer's own).
        most_owed = max(up_reclaimer, key=lambda q: standing(q, resource)[1] - standing(q, resource)[0])
        reclaimer_held, reclaimer_fair = standing(most_owed, resource)
        owed = reclaimer_fair - reclaimer_held
        for queue in up_victim:
            held, fair = standing(queue, resource)
            held += amount if starting else 0.0
            if held <= fair + EPSILON:
                return (
                    f"queue '{queue}' is not above its fair share ({resource} "
                    f"{format_amount(resource, held)} of {format_amount(resource, fair)})"
                )
            if fair - (held - amount) >= owed - EPSILON:
                return (
                    f"queue '{queue}' would end {format_amount(resource, fair - held + amount)} below "
                    f"its fair share ({resource} {format_amount(resource, held)} - "
                    f"{format_amount(resource, amount)} of {format_amount(resource, fair)}), no less than "
                    f"queue '{most_owed}' is now ({format_amount(resource, reclaimer_held)} of "
                    f"{format_amount(resource, reclaimer_fair)}): no fairer"
                )
        held, fair = standing(up_victim[-1], resource)  # V'
        held += amount if starting else 0.0
        diverging_held, diverging_fair = standing(diverging, resource)
        if fair - (held - amount) > diverging_fair - diverging_held + EPSILON:
            return (
                f"queue '{up_victim[-1]}' would end {format_amount(resource, fair - held + amount)} below "
                f"its fair share ({resource} {format_amount(resource, held)} - "
                f"{format_amount(resource, amount)} of {format_amount(resource, fair)}), more than "
                f"queue '{diverging}' is now ({format_amount(resource, diverging_held)} of "
                f"{format_amount(resource, diverging_fair)}): inverted where their paths diverge"
            )
    return ""


def protected_restarts(
    running: Iterable[RunningPod], evicted_at: Callable[[RunningPod], float | None], now: float, rules: Rules
) -> list[str]:
    """Rule 8: the running pods that restarted after an eviction (`evicted_at`: when the pod, or
    the pod it replaces, was last evicted; None: never) less than `rules.recent_victim_s` ago -
    no victims now (the caller spares them: `ClusterSnapshot.spare`)."""
    protected = []
    for pod in running:
        evicted = evicted_at(pod)
        if evicted is not None and pod.started >= evicted and now - pod.started < rules.recent_victim_s:
            protected.append(pod.key)
    return protected


def spent_victims(
    running: Iterable[RunningPod], evictions_of: Callable[[RunningPod], int], rules: Rules
) -> list[str]:
    """Rule 14: the running pods whose replica has been evicted `rules.max_victim_evictions`
    times already (`evictions_of`: the evictions of the pod or of the pods it replaces) - no
    victims again (the caller spares them: `ClusterSnapshot.spare`). None with the budget off (0)."""
    limit = rules.max_victim_evictions
    if limit <= 0:
        return []
    return [pod.key for pod in running if evictions_of(pod) >= limit]


def owed_a_whole_pod(fairness: FairnessSnapshot, queue: str, request: Resources) -> bool:
    """Whether `queue` is owed at least the pod asking `request`: its fair share less what it
    holds is no less than the request, on every GPU resource the pod asks for."""
    tree, shares = fairness.tree, fairness.fair_shares
    return all(
        shares.get(queue, {}).get(resource, 0.0) - tree.subtree(queue, "allocated", resource)
        >= amount - EPSILON
        for resource, amount in gpu_amounts(request).items()
    )


def takes_past_quota(fairness: FairnessSnapshot, queue: str, request: Resources) -> bool:
    """Whether a pod of `queue` asking `request`, once it runs, has its queue or an ancestor hold
    more than its quota of a GPU resource the pod asks for, as the Queue's `Borrowing` condition
    counts it (`has_quota`): what serving it wins is share above the guarantee."""
    tree = fairness.tree
    amounts = gpu_amounts(request)
    return any(
        has_quota(spec, resource)
        and tree.subtree(name, "allocated", resource) + amount > spec.quota.get(resource, 0.0) + EPSILON
        for name in tree.path_to_root(queue)
        for spec in (tree.specs[name],)
        for resource, amount in amounts.items()
    )


def waited_s(waiting: PendingPod, now: float) -> float:
    """How long `waiting` has waited: since `waiting_since`, else since its creation."""
    return now - (waiting.created if waiting.waiting_since is None else waiting.waiting_since)


def whole_owed_wait_over(waiting: PendingPod, now: float, rules: Rules) -> bool:
    """Rule 13: a pod of a queue owed a whole pod reclaims once it has waited
    `rules.whole_owed_wait_s` - capacity that frees by itself within that wait reaches it first
    (deference) and costs no work. No wait (0): at once, whatever the pod's clock says."""
    return rules.whole_owed_wait_s <= 0 or waited_s(waiting, now) >= rules.whole_owed_wait_s


def reclaims_now(fairness: FairnessSnapshot, waiting: PendingPod, now: float, rules: Rules) -> bool:
    """Rules 9 and 13: a pod of a queue owed a whole pod reclaims once it has waited
    `rules.whole_owed_wait_s` (rule 13); one of a queue owed less than the pod only once it has
    waited `rules.partly_owed_wait_s` (rule 9)."""
    if owed_a_whole_pod(fairness, waiting.queue, waiting.resources):
        return whole_owed_wait_over(waiting, now, rules)
    return waited_s(waiting, now) >= rules.partly_owed_wait_for(waiting.queue)


def may_preempt_within(fairness: FairnessSnapshot, queue: str, request: Resources) -> bool:
    """A queue within its fair share (for the pod's GPU resources) may preempt its own pods."""
    tree, shares = fairness.tree, fairness.fair_shares
    return all(
        tree.subtree(queue, "allocated", r) <= shares.get(queue, {}).get(r, 0.0) + EPSILON
        for r in gpu_amounts(request)
    )


def _victim_order(fork: ClusterSnapshot, pod: RunningPod) -> tuple[bool, int, float, str]:
    # Elastic members first, then lowest priority, then newest.
    return (not fork.elastic(pod), pod.priority, -pod.started, pod.key)


def _eligible(pod: RunningPod, goal: Goal, waiting: PendingPod, now: float, rules: Rules) -> bool:
    if not pod.preemptible or pod.terminating or not pod.gpus:
        return False
    if goal == "preempt":
        if pod.queue != waiting.queue or pod.priority >= waiting.priority:
            return False
        min_runtime = rules.preempt_min_runtime_s.get(pod.queue, 0.0)
    else:
        if pod.queue == waiting.queue:
            return False
        if goal == "reclaim" and not lead_within(pod, waiting, now, rules):
            return False
        min_runtime = rules.reclaim_min_runtime_s.get(pod.queue, 0.0)
    return now - pod.started >= min_runtime


def lead_within(victim: RunningPod, waiting: PendingPod, now: float, rules: Rules) -> bool:
    """Rule 15: whether `victim` started at most `rules.victim_lead_s` (grown by
    `rules.victim_lead_per_wait` per second waited) before `waiting` began to wait - its runtime
    is then at most that lead plus the wait."""
    since = waiting.created if waiting.waiting_since is None else waiting.waiting_since
    lead = rules.victim_lead_s + rules.victim_lead_per_wait * max(0.0, now - since)
    return victim.started >= since - lead


def _node_plan(
    fork: ClusterSnapshot, node: str, waiting: PendingPod, goal: Goal, now: float, rules: Rules
) -> tuple[list[Eviction], GpuDemand] | None:
    """Victims on `node` after which `waiting` fits there (rule 3), or None."""
    demand = _on(waiting, fork, node)
    supply = fork.nodes.get(node)
    if supply is None or (demand.models and supply.model not in demand.models):
        return None
    candidates = sorted(
        (p for p in fork.pods_on(node) if _eligible(p, goal, waiting, now, rules)),
        key=lambda pod: _victim_order(fork, pod),
    )
    if not candidates:
        return None
    trial = fork.fork()
    chosen: list[list[Eviction]] = []  # victims in units: a pod, or a gang at its minimum
    for pod in candidates:
        if trial.fitting_nodes(demand, [node]):
            break
        if pod.key not in trial.running:
            continue  # gone with its gang
        unit = trial.unit_of(pod)
        if any(not _eligible(member, goal, waiting, now, rules) for member in unit):
            continue
        taken: dict[str, float] = {}
        for member in unit:
            for resource, amount in member.resources.items():
                taken[resource] = taken.get(resource, 0.0) + amount
        if goal == "reclaim":
            refusal = reclaim_refusal(trial.fairness, waiting.queue, waiting.resources, pod.queue, taken)
            if refusal:
                continue
            message = (
                f"reclaimed for queue '{waiting.queue}' (pod {waiting.key}): queue '{pod.queue}' holds "
                f"more than its fair share of {_gpu_share_text(trial.fairness, pod.queue)}"
            )
        elif goal == "drf":
            if drf_refusal(trial.fairness, waiting.queue, waiting.resources, pod.queue, taken):
                continue
            message = (
                f"reclaimed for queue '{waiting.queue}' (pod {waiting.key}, short of CPU or memory "
                f"on node {node}): {drf_victim_text(trial.fairness, pod.queue)}"
            )
        else:
            message = (
                f"preempted in queue '{pod.queue}' by pod {waiting.key} of higher priority "
                f"({waiting.priority} > {pod.priority})"
            )
        if len(unit) > 1:
            message += (
                f"; with all {len(unit)} running pods of its workload {pod.workload}, which runs whole "
                f"or not at all (minimum {trial.minimums.get(pod.workload, 1)})"
            )
        for member in unit:
            trial.evict(member.key)
        chosen.append([Eviction(member, message) for member in unit])
    if not trial.fitting_nodes(demand, [node]):
        return None
    # Give back victims the pod does not need after all, the last taken first.
    for group in reversed(list(chosen)):
        # What stays evicted without this unit; a gang's members elsewhere free nothing here.
        others = (e.pod for other in chosen if other is not group for e in other if e.pod.node == node)
        if fork.fits_without(node, demand, others):
            chosen.remove(group)
    return [eviction for group in chosen for eviction in group], demand


def fewest_evictions(fork: ClusterSnapshot, node: str, demand: GpuDemand) -> float:
    """A lower bound on the pods a plan must evict from `node` before `demand` fits there, by
    arithmetic (no trial evictions; infinite when evictions cannot make it fit).

    A GPU short of the demand's share needs at least `cost` of its holders evicted: its largest
    holdings first, until what they free covers the shortfall. The demand needs `missing` more
    GPUs, so the evicted pods hold, summed over those GPUs, at least the `missing` smallest
    costs; a pod counts once per GPU it holds, at most `widest` GPUs, hence the bound
    ceil(sum / widest). Example: 8 GPUs wanted on a full node whose GPUs are held whole by 6
    pods and by halves on 2 GPUs: costs 1 x 6 + 2 x 2, bound 10 pods."""
    supply = fork.nodes.get(node)
    if supply is None:
        return 0
    short = {
        index: demand.milli - free for index, free in enumerate(supply.free_milli) if free < demand.milli
    }
    missing = demand.count - (len(supply.free_milli) - len(short))
    if missing <= 0:
        return 0
    holdings: dict[int, list[int]] = {}
    widest = 0
    for pod in fork.pods_on(node):
        widest = max(widest, len(pod.gpus))
        for index, milli in pod.gpus:
            holdings.setdefault(index, []).append(milli)
    costs = sorted(_holders_to_free(holdings.get(index, []), needed) for index, needed in short.items())
    total = sum(costs[:missing])
    return math.ceil(total / widest) if widest and total < math.inf else math.inf


def _holders_to_free(held: list[int], needed: int) -> float:
    """The fewest of a GPU's holdings (thousandths each) that free `needed` (infinite: none do)."""
    freed = 0
    for count, milli in enumerate(sorted(held, reverse=True), start=1):
        freed += milli
        if freed >= needed:
            return count
    return math.inf


def _gpu_share_text(fairness: FairnessSnapshot, queue: str) -> str:
    share = fairness.fair_shares.get(queue, {}).get("gpu", 0.0)
    held = fairness.tree.subtree(queue, "allocated", "gpu")
    return f"{format_amount('gpu', share)} GPUs (holds {format_amount('gpu', held)})"


def _goal_for(fairness: FairnessSnapshot, waiting: PendingPod) -> Goal | None:
    """Reclaim for a pod of a queue below its fair share (holding less than it, in every GPU
    resource the pod asks for), however little below: whether a victim may give is decided per
    victim by `reclaim_refusal`, in whole pods. A queue at 1 of a fair share of 1.5 wanting a
    GPU may take it from a queue holding 2.5 of 1.5 (that one ends at its share, 0 below, less
    owed than the reclaimer's 0.5), not from one holding 2 of 1.5 (it would end 0.5 below, as
    owed as the reclaimer was: a swap, no fairer). Preempt (its own lower-priority pods) for a
    queue at or within its fair share; nothing for a queue above it."""
    tree, shares = fairness.tree, fairness.fair_shares
    wanted = gpu_amounts(waiting.resources)
    if waiting.queue not in tree.specs or not wanted:
        return None
    below = all(
        tree.subtree(waiting.queue, "allocated", r) < shares.get(waiting.queue, {}).get(r, 0.0) - EPSILON
        for r in wanted
    )
    if below:
        return "reclaim"
    return "preempt" if may_preempt_within(fairness, waiting.queue, waiting.resources) else None


DemandKey = tuple[GpuDemand, int | None]  # a waiting pod's demand, and the memory a fraction asks


class DemandNodes:
    """Per demand, the nodes that pass a test of it (fit it, make room for it), kept from one
    snapshot to the next: its owner logs each node whose state changed (`changed`), and a demand
    asked about again has only the nodes logged since its last look tested again (every node, the
    first time). Demands not asked about between two snapshots are forgotten (`next_snapshot`)."""

    def __init__(self) -> None:
        self._changed: list[str] = []  # nodes that changed, oldest first
        self._dropped = 0  # entries of `_changed` every demand had read, dropped from its front
        self._sets: dict[DemandKey, tuple[int, set[str]]] = {}  # demand -> (changes read, nodes)
        self._asked: set[DemandKey] = set()  # demands asked about since the last snapshot

    def changed(self, node: str) -> None:
        self._changed.append(node)

    def next_snapshot(self) -> set[DemandKey]:
        """Forget the demands not asked about since the last call; the ones kept."""
        self._sets = {key: known for key, known in self._sets.items() if key in self._asked}
        kept, self._asked = self._asked, set()
        return kept

    def forget(self) -> None:
        """Forget every demand (what they were tested with changed)."""
        self._sets, self._asked = {}, set()

    def trim(self) -> None:
        """Drop the changes every demand has read."""
        read = min((since for since, _ in self._sets.values()), default=self._dropped + len(self._changed))
        del self._changed[: read - self._dropped]
        self._dropped = read

    def passing(
        self,
        key: DemandKey,
        waiting: PendingPod,
        every: Iterable[str],
        test: Callable[[str, Callable[[int], GpuDemand]], bool],
    ) -> set[str]:
        """The nodes that pass `test` for `waiting` (read-only for the caller): those of the last
        look with the nodes logged since tested again, or every node of `every` the first time.
        `test` gets a node and `waiting`'s demand by GPU memory (a fraction's share depends on it)."""
        self._asked.add(key)
        end, known = self._dropped + len(self._changed), self._sets.get(key)
        look: Iterable[str]
        found: set[str]
        if known is None:
            look, found = list(every), set()
        else:
            since, found = known
            look = self._changed[since - self._dropped :]
        sized: dict[int, GpuDemand] = {}

        def demand_on(memory: int) -> GpuDemand:
            return sized.get(memory) or sized.setdefault(memory, waiting.demand_on(memory))

        for node in look:
            if test(node, demand_on):
                found.add(node)
            else:
                found.discard(node)
        self._sets[key] = (end, found)
        return found


class FitIndex:
    """Where waiting pods' demands fit, kept by the caller from one cycle to the next (the reclaim
    and consolidation executors keep one each; a planner without one looks at every node), so
    "does it fit somewhere now" looks again only at the nodes that changed since the last cycle.

    Per demand, the nodes of a snapshot's base (the picture's nodes, before any fork's changes)
    where it fits (`DemandNodes`), brought up to date with the nodes whose state changed since:
    found by comparing the snapshot's map of nodes with the last one in C (the live picture hands
    out the same object for a node that did not change; an equal one is as good)."""

    def __init__(self) -> None:
        self._base: Mapping[str, NodeGpus] | None = None  # the base last brought in line with
        self._nodes: dict[str, tuple[NodeGpus, int]] = {}  # node -> (its GPUs, its GPU memory)
        self._seen: tuple[dict[str, NodeGpus], dict[str, int]] = ({}, {})  # the maps at the last refresh
        self._fitting = DemandNodes()

    def refresh(self, snapshot: ClusterSnapshot) -> None:
        """Bring the nodes in line with the snapshot's base: those that are other objects than at
        the last refresh (`changed_keys`, in C) are looked at again, and logged unless equal to
        what they were. Nothing to do when the base is the one of the last call."""
        base, memory = snapshot.base_nodes, snapshot.gpu_memory
        if base is self._base:
            return
        self._base = base
        self._fitting.next_snapshot()
        nodes = self._nodes
        look = changed_keys(self._seen[0], base) | changed_keys(self._seen[1], memory)
        self._seen = (dict(base), dict(memory))
        for name in sorted(look):
            supply, size, known = base.get(name), memory.get(name, 0), nodes.get(name)
            if supply is None:
                if nodes.pop(name, None) is not None:
                    self._fitting.changed(name)
                continue
            nodes[name] = (supply, size)
            if known is None or known[1] != size or not (known[0] is supply or known[0] == supply):
                self._fitting.changed(name)
        self._fitting.trim()

    def fitting(self, key: DemandKey, waiting: PendingPod) -> set[str]:
        """The base nodes where `waiting` fits (read-only for the caller)."""
        nodes = self._nodes

        def fits_there(name: str, demand_on: Callable[[int], GpuDemand]) -> bool:
            state = nodes.get(name)
            return state is not None and fits(state[0], demand_on(state[1]))

        return self._fitting.passing(key, waiting, nodes, fits_there)


class Search:
    """What one cycle's search reads often, computed once and only when first needed: node names,
    nodes by free GPU, and nodes by the queues of the preemptible pods running there (victims can
    only be on those); and, with a `FitIndex` kept from the cycles before, where demands fit."""

    def __init__(
        self, fork: ClusterSnapshot, kept: FitIndex | None = None, within: Collection[str] | None = None
    ) -> None:
        """`within`: the only nodes it looks at (a gang kept inside one topology domain)."""
        self.names = sorted(fork.base_nodes if within is None else set(fork.base_nodes) & set(within))
        self._within = None if within is None else frozenset(self.names)
        self._fork = fork
        self._kept = kept
        if kept is not None:
            kept.refresh(fork)
        self._by_free: list[str] | None = None
        self._free_at_start: dict[str, int] = {}  # the free GPU share `by_free` ranked by
        self._nodes_of_queue: dict[str, set[str]] | None = None
        # Per demand: the node (index in `names`) where it fit last, or len(names) when nowhere,
        # and how many nodes were touched then (`fits_somewhere`).
        self._first: dict[tuple[GpuDemand, int | None], tuple[int, int]] = {}
        self.touched: list[str] = []

    @property
    def by_free(self) -> list[str]:
        """Nodes by free GPU share, most first (ranked once per cycle: a heuristic order)."""
        if self._by_free is None:
            nodes = self._fork.nodes
            free = self._free_at_start = {name: sum(nodes[name].free_milli) for name in self.names}
            self._by_free = sorted(self.names, key=lambda name: -free[name])
        return self._by_free

    @property
    def nodes_of_queue(self) -> dict[str, set[str]]:
        """Nodes by the queues of the preemptible GPU pods running there as the cycle began."""
        if self._nodes_of_queue is None:
            self._nodes_of_queue = self._fork.victim_nodes()
        return self._nodes_of_queue

    def candidates(self, fork: ClusterSnapshot, waiting: PendingPod, goal: Goal, limit: int) -> list[str]:
        """Nodes that hold possible victims, the most free GPU first, at most `limit`."""
        if goal == "preempt":
            holding = self.nodes_of_queue.get(waiting.queue, set())
        else:
            # Only queues that could give at least a thousandth of a GPU by the rules.
            least = {r: 1 / GPU_MILLI for r in gpu_amounts(waiting.resources)}
            refusal = drf_refusal if goal == "drf" else reclaim_refusal
            holding = set().union(
                *(
                    nodes
                    for queue, nodes in self.nodes_of_queue.items()
                    if queue != waiting.queue
                    and not refusal(fork.fairness, waiting.queue, waiting.resources, queue, least)
                )
            )
        if not holding:
            return []
        models = waiting.demand.models
        found: list[str] = []
        for name in self.by_free:
            if goal == "drf" and self._free_at_start[name] < waiting.demand.total_milli:
                break  # rule 10 needs its GPUs free: no later node had them as the cycle began
            if name not in holding or (models and fork.nodes[name].model not in models):
                continue
            # Rule 10: only where the pod's GPUs are free and its CPU or memory is not.
            if goal != "drf" or host_starved(fork.nodes[name], _on(waiting, fork, name)):
                found.append(name)
                if len(found) == limit:
                    break
        return found

    def fits_somewhere(self, fork: ClusterSnapshot, waiting: PendingPod) -> str | None:
        """The first node by name where the pod fits now.

        Between calls, nodes only lose room, except those in `touched` (every node that gained
        room must be there). So for a demand looked for before, the nodes before the one found
        then (all of them, when none was) are looked at again only if touched since, and the
        look goes on from that node: the same node as a look at every node, without passing the
        full ones again for every pod."""
        memo = (waiting.demand, waiting.fraction_memory)
        names, nodes, gpu_memory = self.names, fork.nodes, fork.gpu_memory
        sized: dict[int, GpuDemand] = {}  # the demand by GPU memory (a fraction's share depends on it)

        def fitting(name: str) -> bool:
            if self._within is not None and name not in self._within:
                return False  # (touched, but outside the domain looked in)
            memory = gpu_memory.get(name, 0)
            demand = sized.get(memory) or sized.setdefault(memory, waiting.demand_on(memory))
            supply = nodes.get(name)
            return supply is not None and fits(supply, demand)

        if memo not in self._first and self._kept is not None:
            # The kept nodes where it fits, but those the fork changed: looked at now.
            changed = fork.changed_nodes()
            kept = [name for name in self._kept.fitting(memo, waiting) if name not in changed]
            first = min([*kept, *(name for name in changed if fitting(name))], default=None)
            self._first[memo] = (
                len(names) if first is None else bisect_left(names, first),
                len(self.touched),
            )
            return first
        start, seen = self._first.get(memo, (0, len(self.touched)))

        ahead = names[start] if start < len(names) else None
        again = sorted({name for name in self.touched[seen:] if ahead is None or name < ahead})
        found = next((name for name in again if fitting(name)), None)
        if found is not None:
            index = bisect_left(names, found)
        else:
            index = next((i for i in range(start, len(names)) if fitting(names[i])), len(names))
            found = names[index] if index < len(names) else None
        self._first[memo] = (index, len(self.touched))
        return found


def _plan_for(
    fork: ClusterSnapshot,
    search: Search,
    waiting: PendingPod,
    now: float,
    rules: Rules,
    evictions_left: int,
    work: Budget,
) -> Plan | None:
    goal = _goal_for(fork.fairness, waiting)
    if goal is None:
        return None
    needed = waiting.demand.total_milli / GPU_MILLI
    best: tuple[tuple[float, float, int, int], str, list[Eviction]] | None = None
    # Rule 16: the best plan rule 4 refused for its ratio, taken when nothing within it exists.
    beyond_ratio: tuple[tuple[float, float, int, int], str, list[Eviction]] | None = None
    # (Whole-GPU pods only: a fraction keeps rule 4's bound, its own single-GPU exception aside.)
    patience_over = waiting.demand.milli >= GPU_MILLI and waited_s(waiting, now) >= rules.ratio_after_s
    # Rule 10 (DRF) only for a pod neither a GPU reclaim nor preemption serves; a queue owed less
    # than its pod waits for freed GPUs (rule 9) but may still reclaim CPU or memory by DRF.
    goals: list[Goal] = [goal, "preempt", "drf"] if goal == "reclaim" else [goal]
    if goal == "reclaim" and not reclaims_now(fork.fairness, waiting, now, rules):
        goals = ["preempt", "drf"]
    for current in goals:
        for node in search.candidates(fork, waiting, current, rules.node_trials):
            if not work.spend():
                break
            if fewest_evictions(fork, node, _on(waiting, fork, node)) > evictions_left:
                continue  # no plan there could stay within the cycle's evictions (no search needed)
            found = _node_plan(fork, node, waiting, current, now, rules)
            if found is None:
                continue
            evictions, _ = found
            if not evictions or len(evictions) > evictions_left:
                continue
            evicted = sum(e.pod.gpus_held for e in evictions)
            # Fewest GPUs, then the least work lost (GPU-seconds the victims ran), fewest pods,
            # lowest priorities.
            rank = (
                evicted,
                sum(e.pod.gpus_held * (now - e.pod.started) for e in evictions),
                len(evictions),
                sum(e.pod.priority for e in evictions),
            )
            # A DRF plan frees CPU or memory: its victims' GPUs are no measure of what it needs
            # (rule 3 already gave back every victim the pod does not need).
            if (
                current != "drf"
                and evicted / max(needed, 1e-9) > rules.max_ratio + EPSILON
                and not (
                    # One victim no bigger than the whole GPUs the pod needs is the least there is
                    # (a whole-GPU pod for a half-GPU pod); a big one for a small pod is not.
                    len(evictions) == 1 and evicted <= math.ceil(needed - EPSILON)
                )
            ):
                if current == "reclaim" and patience_over and (not beyond_ratio or rank < beyond_ratio[0]):
                    beyond_ratio = (rank, node, evictions)
                continue
            if best is None or rank < best[0]:
                best = (rank, node, evictions)
        if best is not None:
            return Plan(current, waiting, best[1], tuple(best[2]), needed, best[0][0])
    if beyond_ratio is not None:  # no plan within the ratio for any goal
        return Plan("reclaim", waiting, beyond_ratio[1], tuple(beyond_ratio[2]), needed, beyond_ratio[0][0])
    return None


def _on(waiting: PendingPod, fork: ClusterSnapshot, node: str) -> GpuDemand:
    return waiting.demand_on(fork.gpu_memory.get(node, 0))


def planning_fork(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """A fork to plan on: pods already terminating are gone in it (their GPUs are coming free),
    and each pod GPUs are held for is on exactly those GPUs (they are its own: no plan gives them
    to another pod, or frees more for it) - or, where another pod got them, on other free GPUs
    of the node, as the filter keeps it (the DRA allocator chose the devices, and may have given
    a held GPU to another held pod of the gang). A hold its node has no room for any more places
    nothing: it is lost (`lost_holds`)."""
    return _with_holds(snapshot, ())[0]


def lost_holds(snapshot: ClusterSnapshot, going: Collection[str] = ()) -> list[HeldGpus]:
    """Rule 12: the holds whose node has no room for their pod any more, with the pods that are
    terminating (and `going`: pods evicted whose deletion the snapshot may not show yet) gone -
    a pod the hold is not for took the GPUs (one of another scheduler, which sees no holds). The
    caller lets them go, so the pod (a gang: its members left without GPUs) is planned again
    this cycle instead of waiting for the hold to expire.

    Only a pod on the node takes a hold: shares held by claims of no pod there (the snapshot's
    `unaccounted`) count as free. Such a claim is a held pod's own, allocated by the scheduler
    before its bind is seen (a gang member given its neighbour's held GPU, which the neighbour's
    hold then takes elsewhere on the node), or a victim's, left allocated a moment after its pod
    is gone. Before, either made a hold look taken: it was let go, a borrower's replacement took
    the GPUs, and the gang's members were planned again - two more evictions."""
    return _with_holds(snapshot, going, free_unaccounted=True)[1]


def _with_holds(
    snapshot: ClusterSnapshot, going: Collection[str], free_unaccounted: bool = False
) -> tuple[ClusterSnapshot, list[HeldGpus]]:
    """The planning fork (with `going` gone too, and the unaccounted shares free when asked),
    and the holds it could not place."""
    fork = snapshot.fork()
    if free_unaccounted:
        fork.free_unaccounted()
    for key in sorted({*fork.terminating(), *(key for key in going if key in fork.running)}):
        fork.evict(key)
    lost = []
    for key, hold in sorted(snapshot.holds.items()):
        if key not in fork.running and not _place_held(fork, hold):
            lost.append(hold)
    return fork, lost


def _place_held(fork: ClusterSnapshot, hold: HeldGpus) -> bool:
    """Place the pod a hold is for on its GPUs, else (not a queue's rest: that is kept on its
    very GPU) wherever its node still has room; whether it was placed."""
    pod, gpus = _held(hold), tuple(index for index, _ in hold.gpus)
    if fork.place(pod, hold.demand, hold.node, gpus=gpus) is not None:
        return True
    return not hold.for_queue and fork.place(pod, hold.demand, hold.node) is not None


def serving_order(
    fairness: FairnessSnapshot,
    pending: Sequence[PendingPod],
    per_queue: int,
    limit: int,
    reclaims: Callable[[PendingPod], bool] | None = None,
) -> list[PendingPod]:
    """Waiting pods in the order plans serve them: queue by queue, the most owed first
    (`FairnessSnapshot.order`: below its fair share first, over whole subtrees, so across the
    hierarchy), and of each queue its head - highest priority, then oldest - at most `per_queue`
    units: a pod, or a gang's waiting members, listed together (one unit, however many). At most
    `limit` units in all, taken in that order, so the queues that lose out are the least owed;
    a gang is never split. Pods of a queue the tree does not know are left out.

    `reclaims` (a unit by its first pod): whether it may reclaim now (rules 9 and 13). Those that
    may not take `per_queue` places of their own, beside the head of those that may: a queue
    owed one GPU whose 16 oldest pods ask 2 or 4 (owed less than them, they wait for capacity)
    has its 1-GPU pod behind them planned too. (Before, those 16 filled the queue's places and
    its 1-GPU pod was never tried: on `churn` a queue stayed owed a pod for minutes.)

    No window of the oldest pods across queues: a borrower's backlog, however long, takes at most
    `per_queue` places, behind every queue more owed (before, the 64 oldest waiting pods were
    taken and only then ordered by queue: 64 of a borrower's older pods hid every starved queue,
    and the window cut gangs in pieces)."""
    by_queue: dict[str, list[PendingPod]] = {}
    for pod in pending:
        by_queue.setdefault(pod.queue, []).append(pod)
    order: list[PendingPod] = []
    units = 0
    for queue in fairness.order():
        pods = by_queue.get(queue)
        if not pods:
            continue
        pods.sort(key=lambda p: (-p.priority, p.created, p.key))
        gangs: dict[str, list[PendingPod]] = {}
        for pod in pods:
            if pod.workload:
                gangs.setdefault(pod.workload, []).append(pod)
        taken = {True: 0, False: 0}  # places taken by units that may reclaim now, and by the rest
        for pod in pods:
            full = taken[True] >= per_queue and (reclaims is None or taken[False] >= per_queue)
            if full or units >= limit:
                break
            if pod.workload and pod.workload not in gangs:
                continue  # listed with its gang's first member
            group = reclaims is None or reclaims(pod)
            if taken[group] >= per_queue:
                continue
            if pod.workload:
                order.extend(gangs.pop(pod.workload))
            else:
                order.append(pod)
            taken[group] += 1
            units += 1
        if units >= limit:
            break
    return order


def place_if_it_fits(fork: ClusterSnapshot, waiting: PendingPod, search: Search | None = None) -> str | None:
    """A pod that fits already needs no plan: the scheduler places it, and later pods of the cycle
    see its GPUs taken (placed in the fork on the first fitting node, which is returned)."""
    fitting = (search or Search(fork)).fits_somewhere(fork, waiting)
    if fitting is not None:
        fork.place(_arriving(waiting), _on(waiting, fork, fitting), fitting)
    return fitting


def apply_plan(fork: ClusterSnapshot, done: Plan, search: Search | None = None) -> Plan:
    """The fork after a plan: its victims off (a gang's on other nodes too), and the pods it
    serves on the GPUs it holds for them - or, for a plan just made (no holds yet), its pod on the
    node it was made room on, on the GPUs the filter's placement chooses there. Returns the plan
    with its holds (then the GPUs its pod took)."""
    for eviction in done.evictions:
        fork.evict(eviction.pod.key)
    if search is not None:
        search.touched.extend(sorted({e.pod.node for e in done.evictions} | {done.node}))
    if done.holds:
        for hold in done.holds:
            fork.place(_held(hold), hold.demand, hold.node, gpus=tuple(index for index, _ in hold.gpus))
        return done
    placed = fork.place(_arriving(done.pod), _on(done.pod, fork, done.node), done.node)
    if placed is None:
        return done
    return replace(done, holds=(_hold_for(done.pod, placed, done.goal),))


def _hold_for(waiting: PendingPod, placed: RunningPod, goal: Goal) -> HeldGpus:
    """The hold that keeps what `waiting` was placed on in a fork for it: the GPUs, and for a
    plan that freed CPU or memory (rule 10) its CPU and memory too, or another pod takes them
    back before it binds (a GPU plan's holds keep GPUs only, as they always did)."""
    host = goal == "drf"
    return HeldGpus(
        waiting.key,
        waiting.queue,
        placed.node,
        placed.gpus,
        waiting.resources,
        waiting.workload,
        placed.cpu_milli if host else 0,
        placed.memory_mib if host else 0,
    )


class Served:
    """A cycle's plans, and the GPU shares they freed that no pod they serve has taken yet.

    A pod the fork places later in the cycle on such shares fits only because of that plan: it
    rides on it (rule 7) - a hold of its own in the plan, its GPUs added to what the plan needs.
    So the plan that evicts a whole GPU for a half-GPU pod serves the next half-GPU pod too
    (evicted/needed 1.0), and the GPU's other half is kept for that pod rather than left to
    whoever the scheduler tries first. Freed shares are taken in the order the plans freed them,
    before any share that was free already (the least for a pod to ride on)."""

    def __init__(self) -> None:
        self.plans: list[Plan] = []
        # (node, GPU index) -> [plan index, thousandths freed and not taken], oldest plan first
        self._left: dict[tuple[str, int], list[list[int]]] = {}

    def copy(self) -> Served:
        twin = Served()
        twin.plans = list(self.plans)
        twin._left = {at: [list(entry) for entry in entries] for at, entries in self._left.items()}
        return twin

    def adopt(self, trial: Served) -> list[Plan]:
        """Take a copy's plans and shares as its own; the plans it added."""
        added = trial.plans[len(self.plans) :]
        self.plans, self._left = trial.plans, trial._left
        return added

    @property
    def freeing(self) -> bool:
        """Whether shares freed by the plans are left for a pod to ride on."""
        return bool(self._left)

    def add(self, done: Plan) -> None:
        """A plan applied to the fork (its holds known): what it frees, less what its pod took."""
        index = len(self.plans)
        self.plans.append(done)
        for eviction in done.evictions:
            for gpu, milli in eviction.pod.gpus:
                self._left.setdefault((eviction.pod.node, gpu), []).append([index, milli])
        for hold in done.holds:
            self._take(hold.node, hold.gpus)

    def ride(self, fork: ClusterSnapshot, waiting: PendingPod, may_ride: bool) -> None:
        """`waiting` was just placed in the fork: if it took shares a plan freed (and `may_ride`:
        its queue could have had a plan of its own), that plan serves it too."""
        if not self._left:
            return
        placed = fork.running.get(waiting.key)
        if placed is None or not may_ride:
            return  # a pod that may not ride leaves what it lands on kept for the plan's queue (rule 11)
        index = self._take(placed.node, placed.gpus)
        if index is None:
            return
        done = self.plans[index]
        self.plans[index] = replace(
            done,
            holds=(*done.holds, _hold_for(waiting, placed, done.goal)),
            gpus_needed=done.gpus_needed + placed.gpus_held,
        )

    def with_rests(self) -> list[Plan]:
        """The plans, each with the rests it keeps for its queue (rule 11): of the shares it
        freed that no pod took, those on a GPU its own pods share."""
        rests: dict[int, list[HeldGpus]] = {}
        for (node, gpu), entries in sorted(self._left.items()):
            for index, milli in entries:
                done = self.plans[index]
                if milli > 0 and any(h.node == node and gpu in dict(h.gpus) for h in done.holds):
                    key = f"{done.pod.queue}/rest/{node}/{gpu}"
                    rests.setdefault(index, []).append(
                        HeldGpus(key, done.pod.queue, node, ((gpu, milli),), for_queue=True)
                    )
        return [replace(done, rests=tuple(rests.get(i, ()))) for i, done in enumerate(self.plans)]

    def _take(self, node: str, gpus: Sequence[tuple[int, int]]) -> int | None:
        """Take these shares from what plans freed on the node's GPUs; the first plan taken from."""
        first: int | None = None
        for gpu, milli in gpus:
            entries = self._left.get((node, gpu), [])
            while milli > 0 and entries:
                entry = entries[0]
                taken = min(milli, entry[1])
                entry[1] -= taken
                milli -= taken
                first = entry[0] if first is None else first
                if entry[1] <= 0:
                    entries.pop(0)
            if not entries:
                self._left.pop((node, gpu), None)
        return first


def _serve(
    fork: ClusterSnapshot,
    search: Search,
    served: Served,
    waiting: PendingPod,
    now: float,
    rules: Rules,
    evictions_left: int,
    work: Budget,
) -> bool:
    """Serve one waiting pod on the fork: placed where it fits already (riding on a plan of the
    cycle if it takes what that plan freed), else by a plan of its own; False when neither."""
    may_ride = served.freeing and _goal_for(fork.fairness, waiting) is not None
    if take_rest(fork, waiting) or place_if_it_fits(fork, waiting, search):
        served.ride(fork, waiting, may_ride)
        return True
    found = _plan_for(fork, search, waiting, now, rules, evictions_left, work)
    if found is None:
        return False
    served.add(apply_plan(fork, found, search))
    return True


def _plan_gang(
    fork: ClusterSnapshot,
    search: Search,
    served: Served,
    members: Sequence[PendingPod],
    now: float,
    rules: Rules,
    budget: int,
    work: Budget,
) -> list[Plan] | None:
    """Plans making room for every waiting member of a gang (added to `served`), or None (and
    the fork and `served` untouched). A gang with a required topology level is tried inside
    each of its domains in turn, the most free GPU first; the first that serves it whole wins -
    inside the domain of its members GPUs are held for already, when some are (rule 12). A gang
    whose parts ask different levels is served part by part (`_plan_parts`)."""
    if any(member.outer is not None for member in members):
        return _plan_parts(fork, search, served, members, now, rules, budget, work)
    domains = members[0].domains if members else None
    return _plan_in_a_domain(fork, search, served, members, domains, now, rules, budget, work, None)


def _plan_parts(
    fork: ClusterSnapshot,
    search: Search,
    served: Served,
    members: Sequence[PendingPod],
    now: float,
    rules: Rules,
    budget: int,
    work: Budget,
) -> list[Plan] | None:
    """A gang whose parts ask different levels, as admission plans it (`plan_parts`): each domain
    of the widest level (`outer`) in turn, the most free GPU first; in it, the parts narrowest
    level first (the most domains), each inside one domain of its own level within the outer one
    (a part without a level anywhere), each on what the ones before it freed and took; the first
    outer domain where every part is served wins. Racks r1 (n1), r2 (n2); workers requiring a
    host, the leader no level: the workers are served inside one host whatever the leader's."""
    outer = next(member.outer for member in members if member.outer is not None)
    parts: dict[str, list[PendingPod]] = {}
    for member in members:
        parts.setdefault(member.part, []).append(member)
    ordered = sorted(
        parts.values(), key=lambda part: -len(set(part[0].domains.values())) if part[0].domains else 1
    )
    for inside in _domains_by_free(fork, outer, members[0].workload, None):
        trial = fork.fork()
        trial_search = Search(trial)
        trial_served = served.copy()
        for part in ordered:
            evicted = sum(len(p.evictions) for p in trial_served.plans[len(served.plans) :])
            within = inside if part[0].domains is not None else None
            if (
                _plan_in_a_domain(
                    trial,
                    trial_search,
                    trial_served,
                    part,
                    part[0].domains,
                    now,
                    rules,
                    budget - evicted,
                    work,
                    within,
                )
                is None
            ):
                break
        else:
            fork.adopt(trial)
            search.touched.extend(trial_search.touched)
            return served.adopt(trial_served)
    return None


def _domains_by_free(
    fork: ClusterSnapshot, domains: DomainMap, workload: str, inside: Collection[str] | None
) -> list[list[str]]:
    """The nodes of each domain of `domains` (within `inside`, None: all), the most free GPU
    first; only the domains of the workload's members GPUs are held for, when some are."""
    held = {
        domains.get(hold.node)
        for hold in fork.holds.values()
        if hold.workload == workload and hold.key in fork.running
    }
    nodes_of: dict[str, list[str]] = {}
    for node, domain in domains.items():
        if node in fork.base_nodes and (not held or domain in held) and (inside is None or node in inside):
            nodes_of.setdefault(domain, []).append(node)
    free = {d: sum(sum(fork.nodes[n].free_milli) for n in ns) for d, ns in nodes_of.items()}
    return [nodes_of[domain] for domain in sorted(nodes_of, key=lambda d: (-free[d], d))]


def _plan_in_a_domain(
    fork: ClusterSnapshot,
    search: Search,
    served: Served,
    members: Sequence[PendingPod],
    domains: DomainMap | None,
    now: float,
    rules: Rules,
    budget: int,
    work: Budget,
    inside: Collection[str] | None,
) -> list[Plan] | None:
    """`members` served inside one domain of `domains` (None: anywhere), among the nodes `inside`
    (None: all), each domain in turn, the most free GPU first."""
    if domains is None:
        return _plan_gang_within(fork, search, served, members, now, rules, budget, work, inside)
    for nodes in _domains_by_free(fork, domains, members[0].workload, inside):
        done = _plan_gang_within(fork, search, served, members, now, rules, budget, work, nodes)
        if done is not None:
            return done
    return None


def _plan_gang_within(
    fork: ClusterSnapshot,
    search: Search,
    served: Served,
    members: Sequence[PendingPod],
    now: float,
    rules: Rules,
    budget: int,
    work: Budget,
    within: Collection[str] | None,
) -> list[Plan] | None:
    trial = fork.fork()
    trial_search = Search(trial, within=within)
    trial_served = served.copy()
    for member in members:
        evicted = sum(len(p.evictions) for p in trial_served.plans[len(served.plans) :])
        if not _serve(trial, trial_search, trial_served, member, now, rules, budget - evicted, work):
            return None
    fork.adopt(trial)
    search.touched.extend(trial_search.touched)
    return served.adopt(trial_served)


def _held(hold: HeldGpus) -> RunningPod:
    """The pod GPUs are held for, as placed in a fork: arriving, no victim (`_arriving`)."""
    return RunningPod(hold.key, hold.queue, "", (), hold.resources, preemptible=False)


def _arriving(waiting: PendingPod) -> RunningPod:
    """The pod placed in the fork but not running yet: no victim for a later plan of the cycle
    (evicting a pod that is still pending would only delete it)."""
    return RunningPod(
        waiting.key, waiting.queue, "", (), waiting.resources, waiting.priority, preemptible=False
    )


def plan(
    snapshot: ClusterSnapshot,
    pending: Sequence[PendingPod],
    now: float,
    rules: Rules,
    work: Budget | None = None,
    fit_index: FitIndex | None = None,
) -> list[Plan]:
    """This cycle's plans: most deserving queues first, each queue's head pod (highest priority,
    oldest) tried; every plan applied to the fork before the next. `work`: the cycle's budget
    (`rules.max_trials` when not given), which tells afterwards what was cut off; `fit_index`:
    where demands fit, kept by the caller from the cycles before."""
    work = work if work is not None else Budget(rules.max_trials)
    fork = planning_fork(snapshot)
    search = Search(fork, fit_index)
    served = Served()
    evictions_left = rules.max_evictions
    fairness = fork.fairness
    order = serving_order(
        fairness,
        pending,
        rules.max_pending_per_queue,
        rules.max_pending,
        reclaims=lambda waiting: reclaims_now(fairness, waiting, now, rules),
    )
    gangs: dict[str, list[PendingPod]] = {}  # a gang's waiting members without GPUs (listed together)
    for waiting in order:
        if waiting.workload and waiting.key not in fork.running:
            gangs.setdefault(waiting.workload, []).append(waiting)
    served_gangs: set[str] = set()
    for waiting in order:
        if evictions_left <= 0:
            break
        if work.trials <= 0:
            work.cut_off += 1
            continue
        if waiting.key in fork.running:
            continue  # GPUs are held for it: placed there by the planning fork
        if waiting.workload:
            if waiting.workload not in served_gangs:
                served_gangs.add(waiting.workload)
                members = gangs[waiting.workload]
                for done in _plan_gang(fork, search, served, members, now, rules, evictions_left, work) or ():
                    evictions_left -= len(done.evictions)
            continue
        refused, planned = work.refused, len(served.plans)
        if not _serve(fork, search, served, waiting, now, rules, evictions_left, work):
            work.cut_off += work.refused > refused  # its search stopped short
            continue
        evictions_left -= sum(len(done.evictions) for done in served.plans[planned:])
    _ride_beyond_the_cap(fork, search, served, pending, order)
    return served.with_rests()


def take_rest(fork: ClusterSnapshot, waiting: PendingPod) -> bool:
    """Rule 11: a fraction of a queue the rest of a freed GPU is kept for (`HeldGpus.for_queue`,
    placed by the planning fork) goes there first, taking the rest's place - no plan evicts
    again for it. True when it was placed so."""
    for key, rest in sorted(fork.holds.items()):
        if not rest.for_queue or rest.queue != waiting.queue or key not in fork.running:
            continue
        ((gpu, milli),) = rest.gpus
        demand = _on(waiting, fork, rest.node)
        if demand.count != 1 or demand.milli > milli:
            continue
        fork.evict(key)
        if fork.place(_arriving(waiting), demand, rest.node, gpus=(gpu,)) is not None:
            return True
        fork.place(_held(rest), rest.demand, rest.node, gpus=(gpu,))
    return False


def _ride_beyond_the_cap(
    fork: ClusterSnapshot,
    search: Search,
    served: Served,
    pending: Sequence[PendingPod],
    order: Sequence[PendingPod],
) -> None:
    """Pods left out of the cycle by the per-queue cap get no plan of their own, but may still
    ride on shares the cycle's plans freed and their pods did not take (rule 7; a fit, no
    search): a queue's 17th half-GPU pod takes the other half of the GPU evicted for its 16th,
    rather than leave it to the next cycle's first comer and a plan at evicted/needed 2.0."""
    if not served.freeing:
        return
    listed = {pod.key for pod in order}
    rest = [pod for pod in pending if pod.key not in listed and not pod.workload]
    for waiting in serving_order(fork.fairness, rest, len(rest), len(rest)):
        if not served.freeing:
            return
        if waiting.key in fork.running or _goal_for(fork.fairness, waiting) is None:
            continue
        if place_if_it_fits(fork, waiting, search):
            served.ride(fork, waiting, True)
