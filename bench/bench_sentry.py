#!/usr/bin/env python3
"""Signal → triage start, in sentry's supervisor, against a bare asyncio
queue hop (the floor: put_nowait in one callback, get in a consumer task).
With --live, also the pipeline over the real daemons (see `live`).

The signal is injected where the D-Bus callback would deliver it
(`Supervisor.offer`), with the phases faked to return at once, so what is
timed is sentry's own path: ignore check, dedupe, bounded queue, consumer
wake-up. D-Bus delivery itself is not in the figure. The seed's target is
2 ms at p99.

    python -m bench.bench_sentry [--signals N] [--live [--rounds N]]
"""

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def _node(root: Path) -> Iterator[None]:
    """contextd (a unit with a fresh drop-in), inferenced, toold, and modeld +
    runtimed holding SmolLM2, socket-activated on one root, all started."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import varlink
    from tests.models import model_node
    from tests.service.test_contextd import contextd, on, wait_event
    from tests.support import activated

    units = root / "units"
    (units / "bench.service.d").mkdir(parents=True)
    (units / "bench.service").write_text("[Service]\nExecStart=/usr/bin/bench\n")
    with contextlib.ExitStack() as stack:
        running = stack.enter_context(contextd(root / "node", [units]))
        dropin = units / "bench.service.d" / "50-bad.conf"
        dropin.write_text("[Service]\nExecStart=\nExecStart=/bin/false\n")
        wait_event(running, on(dropin, "created"))
        started = [stack.enter_context(model_node(root / "node", stack)),
                   stack.enter_context(activated("toold", root / "node")),
                   stack.enter_context(activated("inferenced", root / "node"))]
        for daemon in started:
            with varlink.Client(address=daemon.address) as client:
                client.get_interfaces()
        yield


async def live(rounds: int) -> dict[str, list[float]]:
    """Manual triages of bench.service through sentry's real phases (Live)
    against the running daemons; the action and the verification are
    instant fakes (no systemd here), so what is timed is sentry's pipeline.
    Per round: the pipeline with the model's decision, the pipeline with
    decide failing at once (the rules decide: the seed's 200 ms part), and
    two floors: the same number of bare Varlink calls to the same daemons
    (Context1.GetStatus, Inference1.GetTopology x2), and SmolLM2 answering
    the same prompt with max_tokens=1 (prompt evaluation alone)."""
    from syntrop.interfaces.context import Context1
    from syntrop.interfaces.inference import Inference1
    from syntrop.interfaces.tool import Tool1
    from syntrop.sentry import decide
    from syntrop.sentry.phases import Live
    from syntrop.sentry.pipeline import Budgets, triage, wall_clock_usec
    from syntrop.sentry.rules import DEFAULT_RECENT_USEC
    from syntrop.varlink.client import connect

    real = Live(systemd=None, model="smollm2", hold_sec=0)

    async def execute(decision: Decision) -> Executed:
        return Executed(outcome="succeeded")

    async def verify(unit: str) -> bool:
        return True

    async def no_model(unit: str, facts: Facts) -> Decision:
        raise RuntimeError("not asked")

    budgets = Budgets(decide_usec=60_000_000)
    with_model = Phases(context=real.context, gang=real.gang, lease=real.lease,
                        decide=real.decide, execute=execute, verify=verify,
                        release=real.release)
    rules_only = Phases(context=real.context, gang=real.gang, lease=real.lease,
                        decide=no_model, execute=execute, verify=verify, release=real.release)
    out: dict[str, list[float]] = {k: [] for k in (
        "incident with SmolLM2's decision", "decide (SmolLM2)", "pipeline without decoding",
        "floor: 3 bare Varlink calls", "floor: prompt eval (1 token)")}
    facts = await real.context("bench.service", wall_clock_usec())
    evidence = decide.Evidence(unit="bench.service", failure_usec=facts.failure_usec,
                               changes=facts.changes, journal=facts.journal)
    async with await connect(Tool1) as tool:
        listed = await tool.ListTools()
    known = decide.specs(listed["tools"] if isinstance(listed, dict) else listed)
    offered = decide.offers(evidence, known, DEFAULT_RECENT_USEC)
    for index in range(rounds + 1):  # the first round warms everything up
        now = wall_clock_usec()
        started = time.perf_counter()
        incident = await triage("bench.service", "manual", phases=with_model, budgets=budgets,
                                clock=wall_clock_usec, detected_usec=now)
        whole = time.perf_counter() - started
        assert incident.decided_by == "model", [p.detail for p in incident.phases]
        [model] = [p for p in incident.phases if p.name == "decide"]
        started = time.perf_counter()
        await triage("bench.service", "manual", phases=rules_only, budgets=budgets,
                     clock=wall_clock_usec, detected_usec=wall_clock_usec())
        without = time.perf_counter() - started
        started = time.perf_counter()
        async with await connect(Context1) as context:
            await context.GetStatus()
        async with await connect(Inference1) as inference:
            await inference.GetTopology()
        async with await connect(Inference1) as inference:
            await inference.GetTopology()
        floor = time.perf_counter() - started
        started = time.perf_counter()
        await _prompt_only(real, decide.messages(evidence, offered))
        prompt = time.perf_counter() - started
        if index:
            for key, value in zip(out, (whole, model.duration_usec / 1e6, without, floor,
                                        prompt), strict=True):
                out[key].append(value)
    return out


async def _prompt_only(real: "Any", messages: list[tuple[str, str]]) -> None:
    from syntrop.interfaces.runtime import ChatMessage, Runtime1, Sampling
    from syntrop.varlink.client import connect

    async with await connect(Runtime1, timeout=120) as runtime:
        async for _ in runtime.Chat(
                model=real.model, messages=[ChatMessage(role=r, content=c) for r, c in messages],
                sampling=Sampling(max_tokens=1, temperature=0.0, top_p=None, top_k=None,
                                  seed=7, stop=None)):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=500)
    parser.add_argument("--live", action="store_true",
                        help="also time the pipeline over the real daemons with SmolLM2")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if args.live:
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            with _node(root):
                os.environ["RUNTIME_DIRECTORY"] = str(root / "node" / "run")
                figures = asyncio.run(live(args.rounds))
        for name, values in figures.items():
            print(f"{name:34} p50 {statistics.median(values) * 1e3:8.1f} ms   "
                  f"p99 {_pct(values, 0.99) * 1e3:8.1f} ms   n={len(values)}")
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
