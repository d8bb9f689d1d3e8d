import asyncio
from pathlib import Path
from typing import Any

from syntrop.sentry.breaker import SECOND, Policy
from syntrop.sentry.config import Config, parse
from syntrop.sentry.findings import Plan
from syntrop.sentry.pipeline import Executed, Facts, Phases
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

    async def execute(unit: str, plan: Plan) -> Executed:
        executed.append(plan.describe())
        return Executed(outcome="succeeded")

    async def verify(unit: str, hold_usec: int) -> bool:
        return False  # a crash loop: never healthy

    return Phases(context=context, lease=fail, decide=fail, execute=execute, verify=verify,
                  release=fail)


def test_supervisor_crash_loop_gets_one_restart_then_a_human_and_persists(
        tmp_path: Path) -> None:
    """Nothing changed and the restart did not hold: the next failure is a
    crash loop, a cause no tool removes, so the unit goes to a human at once
    rather than spending the breaker's cap on more restarts."""
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
    assert executed == ["unit_restart"]
    assert results == ["failed", "needs_human"] + ["breaker_open"] * 6

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


def test_a_unit_left_failed_is_one_episode_until_something_changes(
        tmp_path: Path) -> None:
    """The storm a review measured (100 incidents in 75 s): a unit that stays
    failed after its triage is looked at, not triaged again, while nothing
    changes; a change (a start, contextd's record) triages it once more, and
    every triage, left alone or not, counts toward the breaker."""
    from syntrop.sentry.pipeline import wall_clock_usec

    executed: list[str] = []
    config = Config(policy=Policy(cap=3, base_usec=50_000, max_usec=50_000))
    change = {"at": 0}
    looks: list[int] = []

    async def still_failed(unit: str) -> bool:
        return True

    async def changed(unit: str, since_usec: int) -> bool:
        looks.append(since_usec)
        return change["at"] > since_usec

    async def scenario() -> tuple[list[str], list[str], int]:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(store, phases(executed), config, wall_clock_usec,
                                still_failed=still_failed, changed=changed)
        supervisor.start()
        supervisor.offer(Signal(unit="a.service", trigger="state_failed",
                                detected_usec=wall_clock_usec()))
        await asyncio.sleep(1.0)  # 20 looks' worth of nothing changing
        quiet = [i.trigger for i in await store.incidents(limit=10)]
        [episode] = supervisor.open_episodes()
        assert (episode.unit, episode.triages, episode.results) == ("a.service", 1, ["failed"])
        change["at"] = wall_clock_usec()  # somebody edited something of it
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(await store.incidents(limit=10)) == 2 and not supervisor.pending:
                break
        await asyncio.sleep(0.3)  # and nothing after that change
        await supervisor.close()
        incidents = await store.incidents(limit=10)
        state = await store.breaker("a.service")
        store.close()
        return quiet, [i.trigger for i in incidents], state.attempts

    quiet, triggers, attempts = asyncio.run(scenario())
    assert quiet == ["state_failed"]
    assert len(looks) >= 5  # it was looked at, and left
    assert triggers == ["state_failed", "changed"]
    assert attempts == 2  # the crash loop's "a human must" counted too
    assert executed == ["unit_restart"]


def test_a_protected_unit_gets_an_incident_and_nothing_else(tmp_path: Path) -> None:
    executed: list[str] = []

    async def scenario() -> tuple[str, str, int]:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(store, phases(executed), parse({"protected": ["db-*.service"]}),
                                Clock())
        incident = await supervisor.triage("db-main.service", "job_failed", T0)
        journald = await supervisor.triage("systemd-journald.service", "job_failed", T0)
        attempts = (await store.breaker("db-main.service")).attempts
        store.close()
        assert journald.result == "protected"
        return incident.result, incident.summary, attempts

    result, summary, attempts = asyncio.run(scenario())
    assert result == "protected" and summary.endswith("protected: no action")
    assert executed == [] and attempts == 0


def test_an_incident_left_in_progress_is_closed_as_interrupted(tmp_path: Path) -> None:
    from syntrop.sentry.pipeline import IncidentRecord

    async def scenario() -> tuple[int, str, str]:
        store = Store(tmp_path / "s.sqlite")
        await store.put_incident(IncidentRecord(
            id="x", unit="a.service", detected_usec=T0, trigger="job_failed", decision=None,
            decided_by=None, result="in_progress", phases=[], summary="in progress"))
        closed = await store.interrupted()
        record = await store.incident("x")
        store.close()
        assert record is not None
        return closed, record.result, record.summary

    closed, result, summary = asyncio.run(scenario())
    assert (closed, result) == (1, "interrupted") and "stopped while triaging" in summary


def test_a_unit_waiting_for_its_dependency_is_started_once_that_heals(
        tmp_path: Path) -> None:
    """b.service's start failed with job result `dependency` (a.service
    failed): its incident waits, a.service is triaged, and when that heals
    b.service's lost start is retried (trigger dependency_healed)."""
    from syntrop.sentry.findings import UnitFacts

    executed: list[str] = []
    failed = {"a.service"}

    async def context(unit: str, failure: int) -> Facts:
        deps = ("a.service",) if unit == "b.service" else ()
        return Facts(failure_usec=failure, unit=UnitFacts(
            unit=unit, requires=deps, failed_dependencies=tuple(d for d in deps if d in failed)))

    async def execute(unit: str, plan: Plan) -> Executed:
        executed.append(f"{plan.describe()} {unit}")
        failed.discard(unit)
        return Executed(outcome="succeeded")

    async def verify(unit: str, hold_usec: int) -> bool:
        return True

    async def fail(*_: object) -> Any:
        raise ConnectionRefusedError

    async def start_lost(unit: str) -> bool:
        return True

    async def scenario() -> list[tuple[str, str, str]]:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(
            store, Phases(context=context, lease=fail, decide=fail, execute=execute,
                          verify=verify, release=fail),
            Config(), Clock(), start_lost=start_lost)
        supervisor.start()
        supervisor.offer(Signal(unit="b.service", trigger="job_dependency", detected_usec=T0))
        for _ in range(300):
            if len(executed) >= 2 and not supervisor.pending:
                break
            await asyncio.sleep(0.01)
        await supervisor.close()
        incidents = [(i.unit, i.trigger, i.result) for i in await store.incidents(limit=10)]
        store.close()
        return incidents

    incidents = asyncio.run(scenario())
    assert incidents == [("b.service", "job_dependency", "waiting"),
                         ("a.service", "dependency_of", "healed"),
                         ("b.service", "dependency_healed", "healed")]
    assert executed == ["unit_restart a.service", "unit_restart b.service"]


def test_a_dropin_the_unit_ran_well_with_stays_unlinked_after_sentrys_restart(
        tmp_path: Path) -> None:
    """The unit ran 11 s with a drop-in, crashed, was restarted by sentry
    and died a second later. systemd now shows only that last short run
    (its start came after the drop-in), but the supervisor remembers the
    run that went well: the drop-in is still not linked, never reverted."""
    from syntrop.sentry.findings import Change, UnitFacts

    dropin = "/etc/systemd/system/a.service.d/10-log.conf"
    executed: list[str] = []
    clock = Clock()
    written = T0 - 12 * SECOND
    runs = iter([(written + SECOND // 5, T0 - 2 * SECOND)])  # (active_enter, ...) per triage

    async def context(unit: str, failure: int) -> Facts:
        # First failure: it had run 11.8 s. Later ones: sentry's restart.
        active_enter = next(runs, (failure - SECOND,))[0]
        return Facts(
            failure_usec=failure,
            changes=[Change(kind="dropin", timestamp_usec=written, unit=unit, path=dropin)],
            tools=("unit_restart", "revert_dropin"),
            unit=UnitFacts(unit=unit, active_enter_usec=active_enter,
                           inactive_exit_usec=active_enter - SECOND // 10,
                           drop_in_paths=(dropin,)))

    async def execute(unit: str, plan: Plan) -> Executed:
        executed.append(plan.describe())
        return Executed(outcome="succeeded")

    async def verify(unit: str, hold_usec: int) -> bool:
        return False

    async def fail(*_: object) -> Any:
        raise ConnectionRefusedError

    async def scenario() -> list[tuple[str, str]]:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(
            store, Phases(context=context, lease=fail, decide=fail, execute=execute,
                          verify=verify, release=fail),
            Config(policy=Policy(cap=3, base_usec=SECOND, max_usec=SECOND)), clock)
        causes = []
        for _ in range(2):
            incident = await supervisor.triage("a.service", "state_failed", clock.now)
            assert incident.cause is not None
            causes.append((incident.cause.kind, incident.result))
            clock.now += 5 * SECOND
        store.close()
        return causes

    assert asyncio.run(scenario()) == [("transient", "failed"), ("crash_loop", "needs_human")]
    assert executed == ["unit_restart"]


def test_a_plan_that_did_not_heal_is_not_run_again_the_next_linked_one_is(
        tmp_path: Path) -> None:
    """A drop-in and a cache both linked: the model chose clearing the cache,
    which did not heal; the same incident then tries the drop-in's revert
    and the restart. None is run again in the window: the next triage asks
    a human."""
    from syntrop.sentry.findings import Change, UnitFacts
    from syntrop.sentry.pipeline import StepRecord

    dropin = "/etc/systemd/system/a.service.d/50-bad.conf"
    executed: list[str] = []
    offered: list[list[str]] = []
    clock = Clock()

    async def context(unit: str, failure: int) -> Facts:
        return Facts(
            failure_usec=failure,
            changes=[Change(kind="dropin", timestamp_usec=failure - 30 * SECOND, unit=unit,
                            path=dropin)],
            journal=["a: cannot read /var/cache/a/index.db: bad magic"],
            tools=("unit_restart", "revert_dropin", "clear_cache"),
            unit=UnitFacts(unit=unit, active_enter_usec=failure - SECOND,
                           inactive_exit_usec=failure - SECOND, drop_in_paths=(dropin,),
                           cache_dirs=("/var/cache/a",)))

    async def lease(unit: str) -> str:
        return "lease-1"

    async def decide(unit: str, findings: list[str], cause: str, journal: list[str],
                     plans: list[Plan]) -> Plan:
        offered.append([p.describe() for p in plans])
        return next((p for p in plans if p.describe().startswith("clear_cache")), plans[0])

    async def execute(unit: str, plan: Plan) -> Executed:
        executed.append(plan.describe())
        return Executed(outcome="succeeded", steps=[
            StepRecord(tool=s.tool, parameters=dict(s.parameters), outcome="succeeded")
            for s in plan.steps])

    async def verify(unit: str, hold_usec: int) -> bool:
        return False

    async def release(lease_id: str) -> None:
        return None

    async def scenario() -> list[str]:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(
            store, Phases(context=context, lease=lease, decide=decide, execute=execute,
                          verify=verify, release=release),
            Config(policy=Policy(cap=5, base_usec=SECOND, max_usec=SECOND)), clock)
        results = []
        for _ in range(3):
            incident = await supervisor.triage("a.service", "state_failed", clock.now)
            results.append(incident.result)
            clock.now += 5 * SECOND
        store.close()
        return results

    # One incident tries the model's choice, then the next plans in the
    # rules' order (try → verify → next, at most 3); the next triage has
    # nothing untried left: a human. The breaker then refuses more.
    assert asyncio.run(scenario()) == ["failed", "needs_human", "breaker_open"]
    assert executed == ["clear_cache → unit_restart", "revert_dropin", "unit_restart"]
    assert offered == [["revert_dropin", "clear_cache → unit_restart", "unit_restart",
                        "nothing"]]
