#!/usr/bin/env python3
"""toold's costs, each next to a baseline measured in the same run.

  dry_run        Execute(revert_dropin, dry_run=true) round trip over the
                 real activated socket (schema, unit checks, path checks,
                 audit rows written): it is refused with SystemdUnavailable
                 here, as no systemd answers; that is still the full
                 validate → audit path a refusal takes.
    baseline     ListTools round trip on the same connection (no audit, no
                 checks): the bus's own cost.
  tool process   a sandboxed no-op (the helper's probe action with nothing
                 to try) under bubblewrap + Landlock + seccomp, as toold runs
                 every tool process.
    baselines    `bwrap --ro-bind / / true` (bubblewrap's own spawn cost),
                 a bare fork/exec of `true`, and the same helper with no
                 layers (Python's start-up).

    python bench/bench_toold.py [--rounds N] [--json]
"""

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import varlink

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import activated  # noqa: E402

from syntrop.system import sandbox  # noqa: E402
from syntrop.toold.context import HELPER  # noqa: E402


def timed(function: Callable[[], object], rounds: int) -> dict[str, float]:
    function()  # warm-up
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"p50_ms": statistics.median(samples),
            "p90_ms": samples[min(len(samples) - 1, round(0.9 * (len(samples) - 1)))]}


def bench_dry_run(rounds: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="syntrop-bench-toold-") as scratch:
        root = Path(scratch)
        (root / "config").mkdir()
        (root / "etc").mkdir()
        (root / "config" / "toold.toml").write_text(
            f'unit_dirs = ["{root}/etc"]\ndbus_address = "unix:path={root}/none"\n')
        with activated("toold", root, stderr=subprocess.DEVNULL) as daemon, \
                varlink.Client(address=daemon.address) as client, \
                client.open("io.syntrop.Tool1") as tool:

            def dry() -> None:
                with contextlib.suppress(varlink.VarlinkError):
                    tool.Execute(tool="revert_dropin", parameters={"unit": "a.service"},
                                 dry_run=True)

            return {"Execute dry run (refused, audited)": timed(dry, rounds),
                    "baseline: ListTools": timed(lambda: tool.ListTools(), rounds)}


def bench_tool_process(rounds: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="syntrop-bench-toold-") as target:
        def helper(layers: sandbox.Layers) -> Callable[[], object]:
            return lambda: asyncio.run(sandbox.run(HELPER, {"action": "probe"},
                                                   writable=[target], layers=layers))

        figures = {
            "sandboxed no-op (bwrap+landlock+seccomp)": timed(helper(sandbox.Layers()), rounds),
            "baseline: same helper, no layers": timed(
                helper(sandbox.Layers(bubblewrap=False, landlock=False, seccomp=False)), rounds),
            "baseline: bwrap --ro-bind / / true": timed(lambda: subprocess.run(
                ["bwrap", "--ro-bind", "/", "/", "true"], check=True), rounds),
            "baseline: fork/exec true": timed(lambda: subprocess.run(["true"], check=True),
                                              rounds),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {**bench_dry_run(args.rounds * 5), **bench_tool_process(args.rounds)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, figure in results.items():
        print(f"{name:45} p50 {figure['p50_ms']:8.2f} ms   p90 {figure['p90_ms']:8.2f} ms")
    sandboxed = results["sandboxed no-op (bwrap+landlock+seccomp)"]["p50_ms"]
    bare = results["baseline: same helper, no layers"]["p50_ms"]
    bwrap = results["baseline: bwrap --ro-bind / / true"]["p50_ms"]
    dry = results["Execute dry run (refused, audited)"]["p50_ms"]
    listed = results["baseline: ListTools"]["p50_ms"]
    print(f"sandbox layers add {sandboxed - bare:.1f} ms to a tool process "
          f"({sandboxed / bare:.2f}x the unconfined helper; bwrap alone costs {bwrap:.1f} ms)")
    print(f"a dry run costs {dry / listed:.1f}x a ListTools round trip")


if __name__ == "__main__":
    main()
