"""Why a pod waits, in the words a user reads on it (`kubectl describe pod`) and on its owner.

Every pod Tessera holds back gets a condition and an event (`extender.status`) whose reason is
the CamelCase name of a wait reason and whose message is the admission rule's refusal (the
queue and the numbers, `extender.policy.admission.admit`) followed by what would let the pod go.
One table (`WAIT_REASONS`), keyed by the reason codes the rule, the tenancy check and the filter
already return, so a new code without a row here is a test failure, not a silent message:

* refusals of the admission rule: a limit (`over_limit`), a quota for non-preemptible pods
  (`over_quota`), an unusable queue (`unknown_queue`, `invalid_queue`, `not_leaf`), a namespace
  that may not use its queue (`queue_not_allowed`), a gang waiting for its spec, its pods or the
  GPUs for all its missing pods at once (`gang_reading`, `gang_incomplete`, `gang_no_fit`), or
  for them inside one domain of its required topology level (`gang_no_domain`; one that no
  domain of it could hold with all its GPUs free: `gang_domain_too_small`), a pod above its
  part's minimum waiting for its gang to be admitted (`gang_elastic`);
* a pod its queue admits but no candidate node fits (`unplaced`): with fair share 0 in GPUs
  (the quotas of the queues that ask for GPUs cover the cluster) it runs only on idle GPUs and
  reclaim never frees any for it (`fair_share_zero`); below its fair share reclaim frees GPUs
  for it (`waiting_for_reclaim`); at or above it no reclaim comes, and it waits for GPUs to
  come free (`waiting_for_gpus`). Fair share 4 GPUs, 2 allocated, a pod of 1: 2 + 1 <= 4,
  waiting for reclaim; 4 allocated: 4 + 1 > 4, waiting for free GPUs.

An owner (a Job, a JobSet's Job, a workload) gets one event that sums its pods up
(`owner_summary`): "3 of 4 pods wait: <the message of the reason most of them wait for>".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from extender.policy.fairness import format_amount

# The code of a refusal by tenancy (`extender.policy.tenancy`; the filter's metric label too).
QUEUE_NOT_ALLOWED = "queue_not_allowed"


@dataclass(frozen=True)
class WaitReason:
    condition: str  # the condition's and the event's reason (CamelCase)
    lets_it_go: str  # what would let the pod go, appended to the numbers


WAIT_REASONS: dict[str, WaitReason] = {
    "over_limit": WaitReason(
        "QueueAtLimit", "waits for the queue's running pods to finish, or for its limit to be raised"
    ),
    "over_quota": WaitReason(
        "QueueAtQuota",
        "waits for the queue's non-preemptible pods to finish or its quota to be raised "
        "(a preemptible pod may use more than the quota)",
    ),
    "unknown_queue": WaitReason(
        "UnknownQueue", "waits for that Queue to be created; or recreate the pod naming an existing queue"
    ),
    "invalid_queue": WaitReason(
        "InvalidQueue", "waits for the Queue's hierarchy to be fixed (see its status)"
    ),
    "not_leaf": WaitReason("NotLeafQueue", "waits until the queue has no child queues; or name a leaf queue"),
    QUEUE_NOT_ALLOWED: WaitReason(
        "QueueNotAllowed",
        "waits for the Queue to allow this namespace; or recreate the pod naming a queue it may use",
    ),
    "gang_reading": WaitReason("WaitingForGangSpec", "goes once its owner's spec is read (seconds)"),
    "gang_incomplete": WaitReason("WaitingForGangPods", "waits for its controller to create the rest"),
    "gang_elastic": WaitReason(
        "WaitingForGangAdmission", "goes once the gang's other members admit it at its parts' minimums"
    ),
    "gang_no_fit": WaitReason(
        "WaitingForGangGpus", "waits for GPUs for all its missing pods at once (reclaim may free them)"
    ),
    "gang_no_domain": WaitReason(
        "WaitingForGangDomain",
        "waits for one domain of its required topology level to have GPUs for all its missing pods "
        "(reclaim may free them inside one)",
    ),
    "gang_domain_too_small": WaitReason(
        "GangLargerThanDomain",
        "goes only once its pods ask a wider required topology level, "
        "or one of its domains has that many GPUs",
    ),
    "fair_share_zero": WaitReason(
        "FairShareZero", "runs only on idle GPUs and is reclaimed first; no reclaim frees GPUs for it"
    ),
    "waiting_for_reclaim": WaitReason(
        "WaitingForReclaim", "reclaim frees GPUs for it from queues above their fair share"
    ),
    "waiting_for_gpus": WaitReason("WaitingForGpus", "no reclaim comes for it; waits for GPUs to come free"),
}
# A code not in the table (a refusal added later): still said, with its own words only.
UNLISTED = WaitReason("WaitingForQueue", "")


def wait_reason(code: str) -> WaitReason:
    return WAIT_REASONS.get(code, UNLISTED)


def wait_message(code: str, reason: str) -> str:
    """What the pod's condition and event say: the numbers, then what would let it go."""
    lets_it_go = wait_reason(code).lets_it_go
    return f"{reason}; {lets_it_go}" if lets_it_go else reason


def as_written(condition: str, message: str) -> tuple[str, str]:
    """The code and reason a condition was written from (`wait_reason`, `wait_message`): how a
    new extender instance knows the reasons an earlier one said, so it does not say them again."""
    for code, row in WAIT_REASONS.items():
        suffix = f"; {row.lets_it_go}"
        if row.condition == condition and message.endswith(suffix):
            return code, message[: -len(suffix)]
    return "", message


def unplaced(queue: str, fair_share: float, allocated: float, request: float) -> tuple[str, str]:
    """Why a pod its queue admits waits when no node fits it (code, reason with the numbers):
    its queue's fair share in GPUs, what the queue holds, and what the pod asks."""
    share, held, asked = (format_amount("gpu", amount) for amount in (fair_share, allocated, request))
    if fair_share <= 0:
        return (
            "fair_share_zero",
            f"queue '{queue}' has fair share 0 GPUs (quotas of the queues that ask cover the cluster)",
        )
    numbers = f"queue '{queue}' fair share {share} GPUs: {held} allocated + {asked} asked"
    if allocated + request <= fair_share:
        return "waiting_for_reclaim", f"{numbers}, within it"
    return "waiting_for_gpus", f"{numbers}, beyond it"


@dataclass(frozen=True)
class OwnerSummary:
    reason: str  # the message most of its waiting pods carry: a new one is a new event
    text: str  # the event's message


def owner_summary(messages: Iterable[str], total: int) -> OwnerSummary:
    """One event for an owner: how many of its `total` pods wait, and the most common message
    among theirs (`messages`, one per waiting pod; ties: the first said). 3 of 4 pods at the
    limit: "3 of 4 pods wait: queue 'team-a': gpu allocated 14 + request 1 would exceed ..."."""
    counted = Counter(messages)
    waiting = sum(counted.values())
    common = counted.most_common(1)[0][0] if counted else ""
    others = "" if len(counted) <= 1 else f" (and {len(counted) - 1} other reasons)"
    return OwnerSummary(common, f"{waiting} of {total} pods wait: {common}{others}")
