"""The rule flags the extender (`tessera-extender`) and the queue simulator (`tessera simulate
queues`) share: the reclaim planner's waits and victim rules (rules 9, 13, 14, 15 and 16 of
`extender.policy.reclaim`) and deference's collecting (`extender.policy.deference`).

Declared once, so that both take the same names, defaults and help, and read back once into one
value, `RuleFlags` (`rule_flags(args)`), which refuses a negative number and carries the values to
the reclaim loop, the picture and the simulator's replay (`RuleFlags.applied_to` sets them on the
planner's `Rules`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from extender.policy.deference import COLLECT_FOR_OWED
from extender.policy.reclaim import Rules

# The numeric flags, each with the field of `RuleFlags` it sets: none may be negative.
NUMERIC_RULE_FLAGS = {
    "--partly-owed-wait-s": "partly_owed_wait_s",
    "--whole-owed-wait-s": "whole_owed_wait_s",
    "--max-victim-evictions": "max_victim_evictions",
    "--victim-lead-s": "victim_lead_s",
    "--victim-lead-per-wait": "victim_lead_per_wait",
    "--ratio-after-s": "ratio_after_s",
}


@dataclass(frozen=True)
class RuleFlags:
    """The values of the shared rule flags (their defaults: the planner's and deference's own)."""

    partly_owed_wait_s: float = Rules.partly_owed_wait_s  # rule 9
    whole_owed_wait_s: float = Rules.whole_owed_wait_s  # rule 13
    max_victim_evictions: int = Rules.max_victim_evictions  # rule 14
    victim_lead_s: float = Rules.victim_lead_s  # rule 15
    victim_lead_per_wait: float = Rules.victim_lead_per_wait
    ratio_after_s: float = Rules.ratio_after_s  # rule 16
    collect_for_owed: bool = COLLECT_FOR_OWED

    def __post_init__(self) -> None:
        values = {flag: getattr(self, name) for flag, name in NUMERIC_RULE_FLAGS.items()}
        negative = [f"{flag} {value:g}" for flag, value in values.items() if value < 0]
        if negative:
            raise ValueError(f"cannot be negative: {', '.join(negative)}")

    def applied_to(self, rules: Rules) -> Rules:
        """`rules` with these waits and victim rules."""
        return replace(
            rules,
            partly_owed_wait_s=self.partly_owed_wait_s,
            whole_owed_wait_s=self.whole_owed_wait_s,
            max_victim_evictions=self.max_victim_evictions,
            victim_lead_s=self.victim_lead_s,
            victim_lead_per_wait=self.victim_lead_per_wait,
            ratio_after_s=self.ratio_after_s,
        )


# The flags left at their defaults (a shared, frozen value: a safe default argument).
DEFAULT_RULE_FLAGS = RuleFlags()


def rule_flags(args: argparse.Namespace) -> RuleFlags:
    """The flags `add_rule_flags` declared, as parsed into `args` (ValueError: a negative one)."""
    return RuleFlags(
        partly_owed_wait_s=args.partly_owed_wait_s,
        whole_owed_wait_s=args.whole_owed_wait_s,
        max_victim_evictions=args.max_victim_evictions,
        victim_lead_s=args.victim_lead_s,
        victim_lead_per_wait=args.victim_lead_per_wait,
        ratio_after_s=args.ratio_after_s,
        collect_for_owed=args.collect_for_owed == "on",
    )


def add_rule_flags(parser: argparse.ArgumentParser) -> None:
    """Add --partly-owed-wait-s, --whole-owed-wait-s, --max-victim-evictions, --victim-lead-s,
    --victim-lead-per-wait, --ratio-after-s (the planner's `Rules`, defaults its own) and --collect-for-owed
    (on|off, default `COLLECT_FOR_OWED`) to `parser`."""
    parser.add_argument(
        "--partly-owed-wait-s",
        type=float,
        default=Rules.partly_owed_wait_s,
        help="seconds a pod of a queue owed less than the pod itself waits before it reclaims; until "
        "then capacity that frees goes to it first (rule 9; default inf: it never reclaims)",
    )
    parser.add_argument(
        "--whole-owed-wait-s",
        type=float,
        default=Rules.whole_owed_wait_s,
        help="seconds a pod of a queue owed at least the pod itself waits before it reclaims; until "
        f"then capacity that frees goes to it first (rule 13; default {Rules.whole_owed_wait_s:g})",
    )
    parser.add_argument(
        "--collect-for-owed",
        choices=("on", "off"),
        default="on" if COLLECT_FOR_OWED else "off",
        help="for a waiting pod of several GPUs of a queue below its fair share that fits no node, "
        "borrowers' pods leave the one node chosen to collect for it (default %(default)s)",
    )
    parser.add_argument(
        "--max-victim-evictions",
        type=int,
        default=Rules.max_victim_evictions,
        help="a pod (its replica: a replacement inherits the count) evicted this many times is no "
        "victim again (rule 14; default 0: no budget)",
    )
    parser.add_argument(
        "--victim-lead-s",
        type=float,
        default=Rules.victim_lead_s,
        help="reclaim evicts only pods that started at most this long before the pod served began to "
        "wait (rule 15; default inf: any pod)",
    )
    parser.add_argument(
        "--victim-lead-per-wait",
        type=float,
        default=Rules.victim_lead_per_wait,
        help="seconds the victim lead grows per second the pod served has waited (default 0)",
    )
    parser.add_argument(
        "--ratio-after-s",
        type=float,
        default=Rules.ratio_after_s,
        help="seconds a whole-GPU pod of a queue owed a whole pod waits with no plan within the ratio of "
        "GPUs evicted to needed before it may take the smallest plan beyond it (rule 16; default inf: never)",
    )
