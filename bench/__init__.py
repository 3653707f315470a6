"""Tessera's benchmarks (``python -m bench``); each module runs alone too (``python -m bench.e2e``).

Every benchmark has a smoke mode, ``--smoke``: tiny sizes, one round, a few seconds, the same code
and the same table (ratios included), so ``make test`` notices a benchmark that stopped working
(tests/unit/test_bench_smoke.py, tests/integration/test_bench_smoke.py). Its figures mean nothing.
"""

SMOKE_HELP = "tiny sizes, one round, seconds: checks that the benchmark runs (its figures mean nothing)"
