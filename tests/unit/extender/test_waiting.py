"""Why a pod waits, as its condition and event say it: one row per reason code, with the message.

Every code the admission rule, the tenancy check and the filter return has a row: a refusal that
said only "not enough free GPU" or nothing at all (a gated pod) now names the queue, the numbers
and what would let the pod go.
"""

from __future__ import annotations

import pytest

from extender.policy.admission import (
    GANG_DOMAIN_TOO_SMALL,
    GANG_ELASTIC,
    GANG_INCOMPLETE,
    GANG_NO_DOMAIN,
    GANG_NO_FIT,
    GANG_READING,
)
from extender.policy.waiting import (
    QUEUE_NOT_ALLOWED,
    UNLISTED,
    WAIT_REASONS,
    as_written,
    owner_summary,
    unplaced,
    wait_message,
    wait_reason,
)

LIMIT = "queue 'team-a': gpu allocated 14 + request 1 would exceed its limit (14)"


@pytest.mark.parametrize(
    ("code", "reason", "condition", "message"),
    [
        # Limit 14 GPUs, 14 allocated: 14 + 1 > 14; one of its pods finishing makes room.
        (
            "over_limit",
            LIMIT,
            "QueueAtLimit",
            f"{LIMIT}; waits for the queue's running pods to finish, or for its limit to be raised",
        ),
        (
            "over_quota",
            "queue 'team-a': gpu non-preemptible allocated 4 + request 1 would exceed its quota (4)",
            "QueueAtQuota",
            "queue 'team-a': gpu non-preemptible allocated 4 + request 1 would exceed its quota (4); "
            "waits for the queue's non-preemptible pods to finish or its quota to be raised "
            "(a preemptible pod may use more than the quota)",
        ),
        (
            "unknown_queue",
            "queue 'team-x' does not exist",
            "UnknownQueue",
            "queue 'team-x' does not exist; waits for that Queue to be created; "
            "or recreate the pod naming an existing queue",
        ),
        (
            "invalid_queue",
            "queue 'a' is not usable: parent queue 'gone' of 'a' does not exist",
            "InvalidQueue",
            "queue 'a' is not usable: parent queue 'gone' of 'a' does not exist; "
            "waits for the Queue's hierarchy to be fixed (see its status)",
        ),
        (
            "not_leaf",
            "queue 'org' has child queues (a, b): pods go to a leaf queue",
            "NotLeafQueue",
            "queue 'org' has child queues (a, b): pods go to a leaf queue; "
            "waits until the queue has no child queues; or name a leaf queue",
        ),
        (
            QUEUE_NOT_ALLOWED,
            "namespace 'tenant-x' may not use queue 'team-y'",
            "QueueNotAllowed",
            "namespace 'tenant-x' may not use queue 'team-y'; waits for the Queue to allow this "
            "namespace; or recreate the pod naming a queue it may use",
        ),
        (
            GANG_READING,
            "workload Job/ns/j waits for its minimum: reading the spec of its batch/v1 Job",
            "WaitingForGangSpec",
            "workload Job/ns/j waits for its minimum: reading the spec of its batch/v1 Job; "
            "goes once its owner's spec is read (seconds)",
        ),
        (
            GANG_INCOMPLETE,
            "workload Job/ns/j (minimum 4 pods, 0 placed, 3 present) waits for its pods: "
            "3 of its minimum 4 exist",
            "WaitingForGangPods",
            "workload Job/ns/j (minimum 4 pods, 0 placed, 3 present) waits for its pods: 3 of its minimum "
            "4 exist; waits for its controller to create the rest",
        ),
        (
            GANG_ELASTIC,
            "workload Workload/ns/lw (minimum 5 pods, 4 placed, 7 present) is not admitted yet; this pod "
            "is above its part's minimum (part workers: minimum 4, 4 placed, 6 present): it goes once "
            "the gang is",
            "WaitingForGangAdmission",
            "workload Workload/ns/lw (minimum 5 pods, 4 placed, 7 present) is not admitted yet; this pod "
            "is above its part's minimum (part workers: minimum 4, 4 placed, 6 present): it goes once "
            "the gang is; goes once the gang's other members admit it at its parts' minimums",
        ),
        (
            GANG_NO_FIT,
            "workload Job/ns/j (minimum 4 pods, 0 placed, 4 present) starts whole or not at all: "
            "GPUs free for 3 of its 4 missing pods (1 GPU each)",
            "WaitingForGangGpus",
            "workload Job/ns/j (minimum 4 pods, 0 placed, 4 present) starts whole or not at all: "
            "GPUs free for 3 of its 4 missing pods (1 GPU each); waits for GPUs for all its missing "
            "pods at once (reclaim may free them)",
        ),
        (
            GANG_DOMAIN_TOO_SMALL,
            "workload Job/ns/j (minimum 16 pods, 0 placed, 16 present) starts whole or not at all: "
            "needs 16 GPUs in one rack; the largest rack has 12 GPUs in all, so it cannot start as asked",
            "GangLargerThanDomain",
            "workload Job/ns/j (minimum 16 pods, 0 placed, 16 present) starts whole or not at all: "
            "needs 16 GPUs in one rack; the largest rack has 12 GPUs in all, so it cannot start as asked; "
            "goes only once its pods ask a wider required topology level, or one of its domains has "
            "that many GPUs",
        ),
        (
            "fair_share_zero",
            "queue 'default' has fair share 0 GPUs (quotas of the queues that ask cover the cluster)",
            "FairShareZero",
            "queue 'default' has fair share 0 GPUs (quotas of the queues that ask cover the cluster); "
            "runs only on idle GPUs and is reclaimed first; no reclaim frees GPUs for it",
        ),
        (
            "waiting_for_reclaim",
            "queue 'team-b' fair share 4 GPUs: 2 allocated + 1 asked, within it",
            "WaitingForReclaim",
            "queue 'team-b' fair share 4 GPUs: 2 allocated + 1 asked, within it; reclaim frees GPUs "
            "for it from queues above their fair share",
        ),
        (
            "waiting_for_gpus",
            "queue 'team-b' fair share 4 GPUs: 4 allocated + 1 asked, beyond it",
            "WaitingForGpus",
            "queue 'team-b' fair share 4 GPUs: 4 allocated + 1 asked, beyond it; no reclaim comes "
            "for it; waits for GPUs to come free",
        ),
    ],
)
def test_every_wait_reason_has_its_condition_and_message(
    code: str, reason: str, condition: str, message: str
) -> None:
    assert wait_reason(code).condition == condition
    assert wait_message(code, reason) == message


def test_the_table_has_a_row_for_every_code_and_nothing_else() -> None:
    """A code added to the rule without a row would be said with no remedy: the table is complete."""
    rule = {"over_limit", "over_quota", "unknown_queue", "invalid_queue", "not_leaf"}
    gangs = {GANG_READING, GANG_INCOMPLETE, GANG_ELASTIC, GANG_NO_FIT, GANG_NO_DOMAIN, GANG_DOMAIN_TOO_SMALL}
    placement = {"fair_share_zero", "waiting_for_reclaim", "waiting_for_gpus"}
    assert set(WAIT_REASONS) == rule | gangs | placement | {QUEUE_NOT_ALLOWED}
    assert len({row.condition for row in WAIT_REASONS.values()}) == len(WAIT_REASONS)  # each its own


def test_a_code_without_a_row_is_said_in_its_own_words() -> None:
    assert wait_reason("new_refusal") == UNLISTED
    assert wait_message("new_refusal", "queue 'a' refuses") == "queue 'a' refuses"


@pytest.mark.parametrize(
    ("fair_share", "allocated", "asked", "code", "reason"),
    [
        # Quotas cover the cluster: fair share 0 whatever it holds (it borrows idle GPUs).
        (
            0.0,
            2.0,
            1.0,
            "fair_share_zero",
            "queue 'q' has fair share 0 GPUs (quotas of the queues that ask cover the cluster)",
        ),
        # 2 + 1 <= 4: reclaim takes GPUs back from queues above theirs for it.
        (
            4.0,
            2.0,
            1.0,
            "waiting_for_reclaim",
            "queue 'q' fair share 4 GPUs: 2 allocated + 1 asked, within it",
        ),
        # 3 + 1 = 4: still within (the boundary).
        (
            4.0,
            3.0,
            1.0,
            "waiting_for_reclaim",
            "queue 'q' fair share 4 GPUs: 3 allocated + 1 asked, within it",
        ),
        # 4 + 1 > 4: beyond its share, no reclaim comes.
        (4.0, 4.0, 1.0, "waiting_for_gpus", "queue 'q' fair share 4 GPUs: 4 allocated + 1 asked, beyond it"),
        # A fraction: 1.5 + 0.5 <= 2.
        (
            2.0,
            1.5,
            0.5,
            "waiting_for_reclaim",
            "queue 'q' fair share 2 GPUs: 1.5 allocated + 0.5 asked, within it",
        ),
    ],
)
def test_an_admitted_pod_no_node_fits_says_whether_reclaim_comes(
    fair_share: float, allocated: float, asked: float, code: str, reason: str
) -> None:
    assert unplaced("q", fair_share, allocated, asked) == (code, reason)


def test_an_owner_hears_how_many_wait_and_the_most_common_reason() -> None:
    # 3 of its 4 pods wait: two at the limit, one for its gang's pods; 4 in all.
    summary = owner_summary([LIMIT, LIMIT, "waits for its pods"], 4)
    assert summary.reason == LIMIT
    assert summary.text == f"3 of 4 pods wait: {LIMIT} (and 1 other reasons)"
    assert owner_summary([LIMIT], 1).text == f"1 of 1 pods wait: {LIMIT}"


@pytest.mark.parametrize("code", sorted(WAIT_REASONS))
def test_a_written_condition_gives_back_its_code_and_reason(code: str) -> None:
    """A new extender instance reads what an earlier one wrote: the same reason is not news."""
    assert as_written(wait_reason(code).condition, wait_message(code, LIMIT)) == (code, LIMIT)


def test_a_condition_of_other_words_is_taken_as_it_is() -> None:
    assert as_written("WaitingForQueue", "queue 'a': over its limit") == ("", "queue 'a': over its limit")
