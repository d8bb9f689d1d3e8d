"""toold's refusal reaches the incident and is not forgotten; the
supervisor's memory (runs that went well, plans that did not heal) outlives
sentry's own restart."""

import asyncio
from pathlib import Path
from typing import Any

from syntrop.sentry.breaker import SECOND, Policy
from syntrop.sentry.config import Config
from syntrop.sentry.findings import Change, Plan, UnitFacts
from syntrop.sentry.phases import refused
from syntrop.sentry.pipeline import Executed, Facts, IncidentRecord, Phases, StepRecord
from syntrop.sentry.store import Store
from syntrop.sentry.supervisor import Supervisor
from tests.unit.sentry.test_supervisor import T0, Clock


async def fail(*_: object) -> Any:
    raise ConnectionRefusedError


def test_a_plan_toold_refuses_names_the_protected_unit_and_its_words(tmp_path: Path) -> None:
    clock = Clock()

    async def context(unit: str, failure: int) -> Facts:
        return Facts(failure_usec=failure, unit=UnitFacts(
            unit=unit, inactive_exit_usec=failure - SECOND, exec_main_code=1,
            exec_main_status=1))

    async def execute(unit: str, plan: Plan) -> Executed:
        return refused(plan, "io.syntrop.Tool1.PlanRefused",
                       {"reason": "unit_not_allowed", "step": None,
                        "message": f"{unit} is not allowed"})

    async def verify(unit: str, hold_usec: int) -> bool:
        raise AssertionError("nothing ran: nothing to verify")

    async def scenario() -> list[IncidentRecord]:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(
            store, Phases(context=context, lease=fail, decide=fail, execute=execute,
                          verify=verify, release=fail),
            Config(policy=Policy(cap=3, base_usec=SECOND, max_usec=SECOND)), clock)
        found = []
        for _ in range(3):
            found.append(await supervisor.triage("db.service", "state_failed", clock.now))
            clock.now += 5 * SECOND
        store.close()
        return found

    first, *later = asyncio.run(scenario())
    assert first.cause is not None and first.cause.kind == "unit_protected"
    assert not first.cause.fixable and "db.service is protected" in first.cause.summary
    assert "PlanRefused: db.service is not allowed" in first.cause.summary
    assert [(s.tool, s.outcome, s.message) for s in first.plan] == [
        ("unit_restart", "refused", "PlanRefused: db.service is not allowed")]
    assert first.result == "needs_human"
    for incident in later:
        assert incident.cause is None or incident.cause.kind not in ("transient", "crash_loop")
        assert "transient" not in incident.summary and "crash_loop" not in incident.summary


def test_runs_that_went_well_and_plans_that_failed_survive_sentrys_restart(
        tmp_path: Path) -> None:
    """Each triage by a new supervisor on the same database, as after
    sentry's exit on idle: the drop-in the unit ran 11 s with stays
    unlinked, and the cache clearing that did not heal is not run again."""
    dropin = "/etc/systemd/system/a.service.d/50-x.conf"
    clock = Clock()
    written = T0 - 12 * SECOND
    executed: list[str] = []
    first = [True]

    async def context(unit: str, failure: int) -> Facts:
        # First failure: it had run 11.8 s with the drop-in. Later: a short run.
        began = written + SECOND // 5 if first[0] else failure - SECOND
        first[0] = False
        return Facts(
            failure_usec=failure,
            changes=[Change(kind="dropin", timestamp_usec=written, unit=unit, path=dropin)],
            journal=["a: cannot read /var/cache/a/index.db: bad magic"],
            tools=("unit_restart", "revert_dropin", "clear_cache"),
            unit=UnitFacts(unit=unit, active_enter_usec=began,
                           inactive_exit_usec=began - SECOND // 10, drop_in_paths=(dropin,),
                           cache_dirs=("/var/cache/a",)))

    async def execute(unit: str, plan: Plan) -> Executed:
        executed.append(plan.describe())
        return Executed(outcome="succeeded", steps=[
            StepRecord(tool=s.tool, parameters=dict(s.parameters), outcome="succeeded")
            for s in plan.steps])

    async def verify(unit: str, hold_usec: int) -> bool:
        return False

    async def once() -> IncidentRecord:
        store = Store(tmp_path / "s.sqlite")
        supervisor = Supervisor(
            store, Phases(context=context, lease=fail, decide=fail, execute=execute,
                          verify=verify, release=fail),
            Config(policy=Policy(cap=5, base_usec=SECOND, max_usec=SECOND)), clock)
        incident = await supervisor.triage("a.service", "state_failed", clock.now)
        store.close()
        clock.now += 5 * SECOND
        return incident

    results = [asyncio.run(once()) for _ in range(2)]
    # The first triage tried the rules' plan, then the restart offered beside
    # it; the second has nothing untried left: a human.
    assert executed == ["clear_cache → unit_restart", "unit_restart"]
    assert [i.result for i in results] == ["failed", "needs_human"]
    assert all(dropin in line and "not linked" in line
               for i in results for line in i.findings if dropin in line)


def test_a_refusal_for_another_reason_keeps_the_rules_cause_and_toolds_words() -> None:
    from syntrop.sentry.pipeline import Budgets, triage

    async def context(unit: str, failure: int) -> Facts:
        return Facts(failure_usec=failure, unit=UnitFacts(unit=unit))

    async def execute(unit: str, plan: Plan) -> Executed:
        return refused(plan, "io.syntrop.Tool1.PlanRefused",
                       {"reason": "invalid_step", "step": 0,
                        "message": "step 0: unit: not a unit name"})

    async def verify(unit: str, hold_usec: int) -> bool:
        raise AssertionError("nothing ran: nothing to verify")

    incident = asyncio.run(triage(
        "a.service", "state_failed", budgets=Budgets(), clock=Clock(), detected_usec=T0,
        phases=Phases(context=context, lease=fail, decide=fail, execute=execute,
                      verify=verify, release=fail)))
    assert incident.cause is not None and incident.cause.kind == "transient"
    assert [(s.outcome, s.message) for s in incident.plan] == [
        ("refused", "PlanRefused: step 0: unit: not a unit name")]
    assert incident.result == "failed"
    assert "PlanRefused: step 0: unit: not a unit name" in incident.summary
