#!/usr/bin/env python3
"""Signal → triage start, in sentry's supervisor, against a bare asyncio
queue hop (the floor: put_nowait in one callback, get in a consumer task).

The signal is injected where the D-Bus callback would deliver it
(`Supervisor.offer`), with the phases faked to return at once, so what is
timed is sentry's own path: ignore check, dedupe, bounded queue, consumer
wake-up. D-Bus delivery itself is not in the figure. The seed's target is
2 ms at p99.

    python -m bench.bench_sentry [--signals N]
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from syntrop.sentry.config import Config
from syntrop.sentry.pipeline import Executed, Facts, Phases
from syntrop.sentry.rules import Decision
from syntrop.sentry.store import Store
from syntrop.sentry.supervisor import Signal, Supervisor


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


async def _phases() -> Phases:
    async def context(unit: str, failure: int) -> Facts:
        return Facts(failure_usec=failure)

    async def fail(*_: object) -> str:
        raise ConnectionRefusedError

    async def execute(decision: Decision) -> Executed:
        return Executed(outcome="succeeded")

    async def verify(unit: str) -> bool:
        return True

    async def release(lease: str) -> None:
        return None

    return Phases(context=context, lease=fail, decide=fail,  # type: ignore[arg-type]
                  execute=execute, verify=verify, release=release)


async def sentry_latencies(n: int, folder: Path) -> list[float]:
    store = Store(folder / "bench.sqlite")
    supervisor = Supervisor(store, await _phases(), Config(queue=1024), lambda: 0)
    sent: dict[str, float] = {}
    out: list[float] = []
    supervisor.started = lambda s: out.append(time.perf_counter() - sent[s.unit])
    supervisor.start()
    loop = asyncio.get_running_loop()
    for i in range(n):
        unit = f"bench-{i}.service"
        def signal(unit: str = unit) -> None:
            sent[unit] = time.perf_counter()
            supervisor.offer(Signal(unit=unit, trigger="job_failed", detected_usec=0))

        loop.call_soon(signal)
        while len(out) <= i:
            await asyncio.sleep(0)
        while supervisor.pending:  # let the (fake) triage finish before the next signal
            await asyncio.sleep(0.0005)
    await supervisor.close()
    store.close()
    return out


async def queue_latencies(n: int) -> list[float]:
    queue: asyncio.Queue[float] = asyncio.Queue(1024)
    out: list[float] = []

    async def consume() -> None:
        while True:
            sent = await queue.get()
            out.append(time.perf_counter() - sent)

    task = asyncio.create_task(consume())
    loop = asyncio.get_running_loop()
    for i in range(n):
        loop.call_soon(lambda: queue.put_nowait(time.perf_counter()))
        while len(out) <= i:
            await asyncio.sleep(0)
    task.cancel()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        ours = asyncio.run(sentry_latencies(args.signals, Path(folder)))
    floor = asyncio.run(queue_latencies(args.signals))
    for name, values in (("sentry offer→triage start", ours), ("bare asyncio queue hop", floor)):
        print(f"{name:28} p50 {statistics.median(values) * 1e6:8.1f} us   "
              f"p99 {_pct(values, 0.99) * 1e6:8.1f} us   n={len(values)}")
    ratio = _pct(ours, 0.99) / max(_pct(floor, 0.99), 1e-9)
    print(f"p99 ratio sentry / queue hop: {ratio:.2f}x; target p99 <= 2000 us: "
          f"{'met' if _pct(ours, 0.99) <= 0.002 else 'NOT met'}")


if __name__ == "__main__":
    main()
