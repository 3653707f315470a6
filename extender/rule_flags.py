"""The rule flags the extender (`tessera-extender`) and the queue simulator (`tessera simulate
queues`) share: the reclaim planner's waits and victim rules (rules 9, 13, 14 and 15 of
`extender.policy.reclaim`) and deference's collecting (`extender.policy.deference`).

Declared once, so that both take the same names, defaults and help; each reads the values back by
the flags' destinations (`args.partly_owed_wait_s`, ..., `args.collect_for_owed` "on" or "off").
"""

from __future__ import annotations

import argparse

from extender.policy.deference import COLLECT_FOR_OWED
from extender.policy.reclaim import Rules


def add_rule_flags(parser: argparse.ArgumentParser) -> None:
    """Add --partly-owed-wait-s, --whole-owed-wait-s, --max-victim-evictions, --victim-lead-s,
    --victim-lead-per-wait (the planner's `Rules`, defaults its own) and --collect-for-owed
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
