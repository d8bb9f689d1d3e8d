"""Benchmarks: each prints its figures with the ratio to a named baseline.

    python -m bench            both benchmarks (what `make bench` runs)
    python bench/bench_bus.py  Varlink round trips: ours, python-varlink, asyncvarlink
    python bench/bench_coldstart.py  socket-activated cold start of the seven daemons

docs/BENCHMARKS.md records the latest run and how to read it.
"""
