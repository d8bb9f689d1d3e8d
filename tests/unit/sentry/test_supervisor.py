import asyncio
from pathlib import Path
from typing import Any

from syntrop.sentry.breaker import SECOND, Policy
from syntrop.sentry.config import Config, parse
from syntrop.sentry.pipeline import Executed, Facts, Phases
from syntrop.sentry.rules import Decision
from syntrop.sentry.store import Store
from syntrop.sentry.supervisor import Signal, Supervisor

T0 = 1_000_000 * SECOND


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def phases(executed: list[str]) -> Phases:
    async def context(unit: str, failure: int) -> Facts:
        return Facts(failure_usec=failure)

    async def fail(*_: object) -> Any:
        raise ConnectionRefusedError

    async def execute(decision: Decision) -> Executed:
        executed.append(decision.tool)
        return Executed(outcome="succeeded")

    async def verify(unit: str) -> bool:
        return False  # a crash loop: never healthy

    return Phases(context=context, lease=fail, decide=fail, execute=execute, verify=verify,
                  release=fail)


def test_supervisor_crash_loop_stops_at_cap_and_persists(tmp_path: Path) -> None:
    executed: list[str] = []
    clock = Clock()
    config = Config(policy=Policy(cap=3, base_usec=10 * SECOND, max_usec=60 * SECOND))

    async def scenario() -> list[str]:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(store, phases(executed), config, clock)
        results = []
        for _ in range(8):
            incident = await supervisor.triage("a.service", "state_failed", clock.now)
            results.append(incident.result)
            clock.now += 61 * SECOND
        store.close()
        return results

    results = asyncio.run(scenario())
    assert executed == ["unit_restart"] * 3
    assert results == ["failed"] * 3 + ["breaker_open"] * 5

    async def reopened() -> tuple[bool, int]:
        store = Store(tmp_path / "s.sqlite")
        state = await store.breaker("a.service")
        total = (await store.counts())[1]
        store.close()
        return state.needs_human, total

    assert asyncio.run(reopened()) == (True, 8)


def test_supervisor_offer_ignores_own_units_and_bounds_queue(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(store, phases([]), parse({"queue": 2, "ignore": ["x.*"]}),
                                Clock())
        assert not supervisor.offer(Signal(unit="toold.service", trigger="job_failed",
                                           detected_usec=T0))
        assert not supervisor.offer(Signal(unit="x.service", trigger="job_failed",
                                           detected_usec=T0))
        assert supervisor.offer(Signal(unit="a.service", trigger="job_failed",
                                       detected_usec=T0))
        assert not supervisor.offer(Signal(unit="a.service", trigger="state_failed",
                                           detected_usec=T0))
        assert supervisor.offer(Signal(unit="b.service", trigger="job_failed",
                                       detected_usec=T0))
        assert not supervisor.offer(Signal(unit="c.service", trigger="job_failed",
                                           detected_usec=T0))
        assert supervisor.dropped == 1
        store.close()

    asyncio.run(scenario())


def test_supervisor_consumer_triages_queued_signal(tmp_path: Path) -> None:
    executed: list[str] = []

    async def scenario() -> int:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(store, phases(executed), Config(), Clock())
        supervisor.start()
        supervisor.offer(Signal(unit="a.service", trigger="job_failed", detected_usec=T0))
        for _ in range(200):
            if executed and not supervisor.pending:
                break
            await asyncio.sleep(0.01)
        await supervisor.close()
        total = (await store.counts())[1]
        store.close()
        return total

    assert asyncio.run(scenario()) == 1
    assert executed == ["unit_restart"]


def test_config_watch_syntrop_unignores_own_units() -> None:
    assert parse({}).ignored("toold.service")
    assert not parse({"watch_syntrop": True}).ignored("toold.service")


def test_supervisor_retries_after_backoff_until_cap(tmp_path: Path) -> None:
    from syntrop.sentry.pipeline import wall_clock_usec

    executed: list[str] = []
    config = Config(policy=Policy(cap=2, base_usec=50_000, max_usec=50_000))

    async def still_failed(unit: str) -> bool:
        return True

    async def scenario() -> list[str]:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(store, phases(executed), config, wall_clock_usec,
                                still_failed=still_failed)
        supervisor.start()
        supervisor.offer(Signal(unit="a.service", trigger="state_failed",
                                detected_usec=wall_clock_usec()))
        await asyncio.sleep(0.5)
        await supervisor.close()
        triggers = [i.trigger for i in await store.incidents(limit=10)]
        assert (await store.breaker("a.service")).attempts == 2
        store.close()
        return triggers

    assert asyncio.run(scenario()) == ["state_failed", "backoff_retry"]
    assert executed == ["unit_restart", "unit_restart"]
