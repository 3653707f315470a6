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

from .hotpath import Payloads


def _ms(action: Callable[[], object], budget_s: float = 0.5) -> float:
    number = max(1, int(budget_s / max(timeit.timeit(action, number=1), 1e-6)))
    return min(timeit.repeat(action, number=number, repeat=3)) / number * 1000


def _row(nodes: int, mode: str, orjson: Any) -> list[str]:
    body = Payloads(nodes, mode).body(1)
    args = decode(ExtenderArgs, body)
    answer = filter_result(args, args.candidate_names(), {})
    plain = msgspec.json.decode(encode(answer))
    times: list[float | None] = [
        _ms(lambda: json.loads(body)),
        _ms(lambda: msgspec.json.decode(body)),
        _ms(lambda: decode(ExtenderArgs, body)),
        _ms(lambda: orjson.loads(body)) if orjson is not None else None,
        _ms(lambda: json.dumps(plain).encode()),
        _ms(lambda: msgspec.json.encode(plain)),
        _ms(lambda: encode(answer)),
        _ms(lambda: orjson.dumps(plain)) if orjson is not None else None,
    ]
    return [str(nodes), mode, f"{len(body) / 1000:.0f}", *("-" if t is None else f"{t:.3f}" for t in times)]


def run_codec(node_counts: Sequence[int]) -> list[list[str]]:
    try:
        orjson: Any = importlib.import_module("orjson")
    except ImportError:
        orjson = None
    return [_row(nodes, mode, orjson) for nodes in node_counts for mode in ("names", "nodelist")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="500,5000")
    args = parser.parse_args(list(argv) if argv is not None else None)
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
    print(format_table(headers, run_codec([int(n) for n in args.nodes.split(",")])))
    print("typed: extender.wire's structs (what the extender runs); '-': orjson not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
