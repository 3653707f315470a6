"""Benchmark: the JSON codecs on the extender's real request and answer shapes (benchmark 1's).

Decoding a filter request (a new pending pod plus the candidate nodes, as names or as a NodeList)
and encoding the answer, per codec: the standard library's `json` (the baseline), msgspec
untyped (to dicts) and msgspec typed (`extender.wire`'s structs, what the extender runs), and
orjson when it is installed (not a dependency: it was measured to choose). Best of 3 repeats.

    python -m bench.codec [--nodes 500,5000]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from extender.wire import ExtenderArgs, decode, encode, filter_result
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .hotpath import Payloads

BUDGET_S, SMOKE_BUDGET_S = 0.5, 0.005  # timing per codec and payload


def _ms(action: Callable[[], object], budget_s: float) -> float:
    number = max(1, int(budget_s / max(timeit.timeit(action, number=1), 1e-6)))
    return min(timeit.repeat(action, number=number, repeat=3)) / number * 1000


def _row(nodes: int, mode: str, orjson: Any, budget_s: float) -> list[str]:
    body = Payloads(nodes, mode).body(1)
    args = decode(ExtenderArgs, body)
    answer = filter_result(args, args.candidate_names(), {})
    plain = msgspec.json.decode(encode(answer))
    times: list[float | None] = [
        _ms(lambda: json.loads(body), budget_s),
        _ms(lambda: msgspec.json.decode(body), budget_s),
        _ms(lambda: decode(ExtenderArgs, body), budget_s),
        _ms(lambda: orjson.loads(body), budget_s) if orjson is not None else None,
        _ms(lambda: json.dumps(plain).encode(), budget_s),
        _ms(lambda: msgspec.json.encode(plain), budget_s),
        _ms(lambda: encode(answer), budget_s),
        _ms(lambda: orjson.dumps(plain), budget_s) if orjson is not None else None,
    ]
    return [str(nodes), mode, f"{len(body) / 1000:.0f}", *("-" if t is None else f"{t:.3f}" for t in times)]


def run_codec(node_counts: Sequence[int], budget_s: float = BUDGET_S) -> list[list[str]]:
    try:
        orjson: Any = importlib.import_module("orjson")
    except ImportError:
        orjson = None
    return [_row(nodes, mode, orjson, budget_s) for nodes in node_counts for mode in ("names", "nodelist")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="500,5000")
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP} (50 nodes)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    node_counts, budget_s = (
        ([50], SMOKE_BUDGET_S) if args.smoke else ([int(n) for n in args.nodes.split(",")], BUDGET_S)
    )
    print("\n[codec] ms per filter request (decode) and answer (encode), best of 3")
    headers = [
        "nodes",
        "mode",
        "request KB",
        "json dec",
        "msgspec dec",
        "typed dec",
        "orjson dec",
        "json enc",
        "msgspec enc",
        "typed enc",
        "orjson enc",
    ]
    print(format_table(headers, run_codec(node_counts, budget_s)))
    print("typed: extender.wire's structs (what the extender runs); '-': orjson not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
