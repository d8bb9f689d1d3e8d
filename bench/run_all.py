#!/usr/bin/env python3
"""Run both benchmarks and print their figures (about two minutes on 2 cores).

    python -m bench [--quick] [--json] [--candidate DIR]
    python bench/run_all.py …          the same

--quick   one round per server and 5 cold starts per daemon (about a minute)
--json    one JSON object {"bus": …, "coldstart": …} instead of the tables
--candidate DIR
          also measure our server and daemons from DIR/syntrop (a changed copy
          of src/), alternating with the tree under test
"""

import argparse
import json
import os
import sys
import time

try:
    from bench import bench_bus, bench_coldstart
except ImportError:  # run as a script: bench/ is sys.path[0]
    import bench_bus  # type: ignore[import-not-found,no-redef]
    import bench_coldstart  # type: ignore[import-not-found,no-redef]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the syntrop benchmarks.")
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--candidate", metavar="DIR",
                        help="also measure the syntrop package found in DIR")
    args = parser.parse_args(argv)
    candidate = os.path.abspath(args.candidate) if args.candidate else None
    servers: tuple[str, ...] = bench_bus.SERVERS + bench_bus.REFERENCES
    if candidate:
        bench_bus.CANDIDATE["path"] = candidate
        servers += ("candidate",)
    started = time.monotonic()
    bus = bench_bus.run(rounds=1 if args.quick else 3, servers=servers)
    bus["inprocess"] = bench_bus.inprocess(candidate)
    if not args.json:
        print(bench_bus.format_table(bus), flush=True)
        for name, row in bus["inprocess"].items():
            print(f"in-process, {name}: {row['us_per_call_min']:.1f} us CPU per call through "
                  "the connection code alone (no event loop, no second process)")
        print(flush=True)
    cold = bench_coldstart.run(samples=5 if args.quick else 10, candidate=candidate)
    if args.json:
        json.dump({"bus": bus, "coldstart": cold}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(bench_coldstart.format_report(cold))
        print(f"\n(benchmarks took {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
