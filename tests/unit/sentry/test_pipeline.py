import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from syntrop.sentry.findings import Change, Plan, UnitFacts
from syntrop.sentry.pipeline import (
    Budgets,
    Executed,
    Facts,
    IncidentRecord,
    Phases,
    Policy,
    StepRecord,
    triage,
)

S = 1_000_000
MS = 1_000
FAIL = 1_000_000 * S
FAST = Budgets(context_usec=50 * MS, lease_usec=50 * MS, decide_usec=50 * MS,
               execute_usec=50 * MS, verify_usec=50 * MS, release_usec=50 * MS)


class Clock:
    """Fake clock: every reading advances 1 ms, so durations are exact."""

    def __init__(self) -> None:
        self.now = FAIL

    def __call__(self) -> int:
        self.now += MS
        return self.now


#: The failed start began 2 s before the failure; the unit last ran well an hour ago.
RESTARTED = UnitFacts(unit="a.service", active_enter_usec=FAIL - 3600 * S,
                      inactive_exit_usec=FAIL - 2 * S)


class Fakes:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.executed: list[Plan] = []
        self.released: list[str] = []
        self.changes: list[Change] = []
        self.offered: list[list[str]] = []
        self.holds: list[int] = []
        self.unit: UnitFacts | None = RESTARTED
        self.active = True
        self.plan_outcome = "succeeded"

    async def context(self, unit: str, failure_usec: int) -> Facts:
        self.calls.append("context")
        return Facts(failure_usec=failure_usec, changes=self.changes, unit=self.unit)

    async def lease(self, unit: str) -> str:
        self.calls.append("lease")
        return "lease-1"

    async def decide(self, unit: str, findings: list[str], cause: str, journal: list[str],
                     offered: list[Plan]) -> Plan:
        self.calls.append("decide")
        self.offered.append([p.describe() for p in offered])
        return offered[0]

    async def execute(self, unit: str, plan: Plan) -> Executed:
        self.calls.append("execute")
        self.executed.append(plan)
        return Executed(outcome=self.plan_outcome, steps=[
            StepRecord(tool=s.tool, parameters=dict(s.parameters), outcome=self.plan_outcome)
            for s in plan.steps])

    async def verify(self, unit: str, hold_usec: int) -> bool:
        self.calls.append("verify")
        self.holds.append(hold_usec)
        return self.active

    async def release(self, lease_id: str) -> None:
        self.calls.append("release")
        self.released.append(lease_id)

    def phases(self, *, context: Callable[[str, int], Awaitable[Facts]] | None = None,
               decide: Callable[[str, list[str], str, list[str], list[Plan]], Awaitable[Plan]]
               | None = None,
               gang: Callable[[str, Facts], Awaitable[str]] | None = None) -> Phases:
        """The fakes' phases, with `context`, `decide` and `gang` where given."""
        return Phases(context=self.context if context is None else context, lease=self.lease,
                      decide=self.decide if decide is None else decide, execute=self.execute,
                      verify=self.verify, release=self.release, gang=gang)


async def _hang(*_: object) -> Any:
    await asyncio.sleep(3600)


async def _fail(*_: object) -> Any:
    raise ConnectionRefusedError("no such daemon")


def run(phases: Phases, **kwargs: Any) -> IncidentRecord:
    return asyncio.run(triage("a.service", "job_failed", phases=phases, budgets=FAST,
                              clock=Clock(), detected_usec=FAIL, **kwargs))


def outcomes(incident: IncidentRecord) -> dict[str, str]:
    return {p.name: p.outcome for p in incident.phases}


def test_pipeline_all_phases_ok_model_decides() -> None:
    fakes = Fakes()
    incident = run(fakes.phases())
    assert fakes.calls == ["context", "lease", "decide", "execute", "verify", "release"]
    assert incident.decided_by == "model" and incident.result == "healed"
    assert set(outcomes(incident).values()) == {"ok"}
    assert all(p.duration_usec == MS for p in incident.phases)
    assert json.loads(incident.decision or "") == {
        "tool": "unit_restart", "parameters": {"unit": "a.service"}}
    assert incident.cause is not None and incident.cause.kind == "transient"
    assert [(s.tool, s.outcome) for s in incident.plan] == [("unit_restart", "succeeded")]
    assert fakes.offered == [["unit_restart", "nothing"]]
    assert fakes.holds == [12 * S]  # it had run for an hour: the longest hold


def test_pipeline_decide_timeout_falls_back_to_rules_and_releases() -> None:
    fakes = Fakes()
    fakes.changes = [Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit="a.service",
                            path="/etc/systemd/system/a.service.d/bad.conf")]
    incident = run(fakes.phases(decide=_hang))
    assert outcomes(incident)["decide"] == "timeout"
    assert incident.decided_by == "rules"
    assert fakes.executed[0].describe() == "revert_dropin"
    assert fakes.released == ["lease-1"]
    assert incident.result == "healed"
    assert incident.cause is not None and incident.cause.kind == "dropin_changed"


def test_pipeline_a_two_step_plan_and_its_failed_step() -> None:
    fakes = Fakes()
    fakes.unit = UnitFacts(unit="a.service", need_daemon_reload=True)
    fakes.plan_outcome = "failed"
    incident = run(fakes.phases(decide=_fail))
    # The rules' plan failed: the next offered plan was tried, and failed too.
    assert [p.describe() for p in fakes.executed] == ["daemon_reload → unit_restart",
                                                      "unit_restart"]
    assert [s.tool for s in incident.plan] == ["unit_restart"]
    assert outcomes(incident)["verify"] == "skipped" and incident.result == "failed"
    assert "tried daemon_reload → unit_restart (not healed), unit_restart failed" \
        in incident.summary
    assert incident.tried == ["daemon_reload → unit_restart", "unit_restart"]
    tries = [p.detail for p in incident.phases if p.name == "execute"]
    assert [t.split(":")[0] for t in tries] == ["try 1", "try 2"], tries


def test_pipeline_out_of_reach_cause_needs_a_human() -> None:
    fakes = Fakes()
    fakes.unit = UnitFacts(unit="a.service", exec_main_code=1, exec_main_status=203,
                           exec_paths=("/usr/bin/a",), missing_exec=("/usr/bin/a",))
    incident = run(fakes.phases())
    assert "execute" not in fakes.calls and "decide" not in fakes.calls
    assert incident.result == "needs_human" and incident.plan == []
    assert incident.cause is not None and incident.cause.kind == "executable_missing"
    assert "no tool can fix it" in incident.summary


def test_pipeline_flapping_unit_is_held_longer_than_it_lived() -> None:
    fakes = Fakes()
    fakes.unit = UnitFacts(unit="a.service", active_enter_usec=FAIL - 4 * S,
                           inactive_exit_usec=FAIL - 4 * S)
    run(fakes.phases(), policy=Policy(hold_min_usec=5 * S, hold_max_usec=12 * S))
    assert fakes.holds == [9 * S]


def test_pipeline_every_daemon_missing_rules_decide_nothing_healed() -> None:
    incident = run(Phases(context=_fail, lease=_fail, decide=_fail, execute=_fail,
                          verify=_fail, release=_fail))
    assert outcomes(incident) == {"context": "failed", "lease": "failed",
                                  "decide": "skipped", "execute": "failed",
                                  "verify": "skipped", "release": "skipped"}
    assert incident.decided_by == "rules" and incident.result == "failed"
    assert json.loads(incident.decision or "")["tool"] == "unit_restart"
    assert "ConnectionRefusedError" in incident.phases[0].detail


def test_pipeline_model_unavailable_is_visible() -> None:
    fakes = Fakes()
    incident = run(fakes.phases(decide=_fail))
    assert outcomes(incident)["decide"] == "failed"
    assert incident.decided_by == "rules"
    assert "rules planned unit_restart" in incident.summary


def test_pipeline_context_overrun_still_decides() -> None:
    fakes = Fakes()
    incident = run(fakes.phases(context=_hang, decide=_fail))
    assert outcomes(incident)["context"] == "timeout"
    assert incident.phases[0].detail == "over its budget of 50 ms"
    assert fakes.executed[0].describe() == "unit_restart"


def test_pipeline_unit_not_active_after_action_fails() -> None:
    fakes = Fakes()
    fakes.active = False
    assert run(fakes.phases()).result == "failed"


def test_pipeline_breaker_open_runs_nothing() -> None:
    fakes = Fakes()
    incident = run(fakes.phases(), breaker_open=True)
    assert fakes.calls == []
    assert incident.result == "breaker_open" and incident.decision is None
    assert set(outcomes(incident).values()) == {"skipped"}


def test_pipeline_hard_budget_bounds_wall_time() -> None:
    loop_time: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await triage("a.service", "manual", phases=Phases(
            context=_hang, lease=_hang, decide=_hang, execute=_hang, verify=_hang,
            release=_hang), budgets=FAST, clock=Clock(), detected_usec=FAIL)
        loop_time.append(loop.time() - start)

    asyncio.run(scenario())
    # context, lease, execute overrun (decide/verify/release skipped): ~150 ms
    assert loop_time[0] < 0.5


def test_pipeline_model_choosing_none_runs_nothing() -> None:
    fakes = Fakes()

    async def none(unit: str, findings: list[str], cause: str, journal: list[str],
                   offered: list[Plan]) -> Plan:
        return Plan(reason="answer '...'")

    incident = run(fakes.phases(decide=none))
    assert fakes.calls == ["context", "lease", "release"]
    assert incident.decided_by == "model" and incident.result == "left_alone"
    assert outcomes(incident)["execute"] == "skipped"
    assert incident.phases[3].detail == "the model chose no plan"


def test_pipeline_decide_detail_carries_the_answer() -> None:
    fakes = Fakes()

    async def chosen(unit: str, findings: list[str], cause: str, journal: list[str],
                     offered: list[Plan]) -> Plan:
        return Plan(steps=offered[0].steps, reason="answer '{...}' (22 tokens; Chat 310 ms)")

    incident = run(fakes.phases(decide=chosen))
    [decide] = [p for p in incident.phases if p.name == "decide"]
    assert decide.detail.startswith("model chose unit_restart; answer")
    assert "Chat 310 ms" in decide.detail


def test_pipeline_gang_runs_on_kernel_lines_and_triage_goes_on() -> None:
    fakes = Fakes()
    seen: list[list[str]] = []
    fakes.changes = [Change(kind="kernel", timestamp_usec=FAIL, action="gpu",
                            summary="kernel: GPU error: ring gfx timeout")]

    async def gang(unit: str, facts: Facts) -> str:
        seen.append(facts.kernel_lines())
        return "quarantine drm-renderD128"

    incident = run(fakes.phases(gang=gang))
    assert seen == [["kernel: GPU error: ring gfx timeout"]]
    assert [p.name for p in incident.phases][:3] == ["context", "gang", "lease"]
    assert incident.phases[1].detail == "quarantine drm-renderD128"
    assert incident.result == "healed"


def test_pipeline_gang_skipped_without_lines_and_bounded() -> None:
    fakes = Fakes()
    incident = run(fakes.phases(gang=_hang))
    assert outcomes(incident)["gang"] == "skipped"
    fakes.changes = [Change(kind="kernel", timestamp_usec=FAIL, summary="x")]
    incident = run(fakes.phases(gang=_hang))
    assert outcomes(incident)["gang"] == "timeout" and incident.result == "healed"


def test_pipeline_budget_holds_against_a_phase_that_swallows_cancellation() -> None:
    """A cancellation lost inside the phase (as asyncio.wait_for loses one
    that races a ready streamed reply) must not stretch the budget."""
    fakes = Fakes()
    elapsed: list[float] = []

    async def stubborn(unit: str, findings: list[str], cause: str, journal: list[str],
                       offered: list[Plan]) -> Plan:
        loop = asyncio.get_running_loop()
        end = loop.time() + 0.4
        while loop.time() < end:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.005)
        return offered[0]

    async def scenario() -> IncidentRecord:
        loop = asyncio.get_running_loop()
        start = loop.time()
        incident = await triage("a.service", "manual", phases=fakes.phases(decide=stubborn),
                                budgets=FAST, clock=Clock(), detected_usec=FAIL)
        elapsed.append(loop.time() - start)
        return incident

    incident = asyncio.run(scenario())
    assert outcomes(incident)["decide"] == "timeout" and incident.decided_by == "rules"
    assert elapsed[0] < 0.3


def test_pipeline_decide_overrun_says_what_the_model_had_answered() -> None:
    fakes = Fakes()
    phases = Phases(context=fakes.context, lease=fakes.lease, decide=_hang,
                    execute=fakes.execute, verify=fakes.verify, release=fakes.release,
                    decide_progress=lambda: "the model had answered '{\"tool\": \"un' (5 tokens)")
    incident = run(phases)
    [decide] = [p for p in incident.phases if p.name == "decide"]
    assert decide.detail == ("over its budget of 50 ms; the model had answered "
                             "'{\"tool\": \"un' (5 tokens)")
    assert incident.decided_by == "rules" and incident.result == "healed"


def test_a_context_phase_that_failed_is_named_in_a_transient_cause() -> None:
    fakes = Fakes()
    incident = run(fakes.phases(context=_fail))
    assert outcomes(incident)["context"] == "failed"
    assert incident.cause is not None and incident.cause.kind == "transient"
    assert "not everything was read" in incident.cause.summary
    assert any(line.startswith("not read: the context phase: failed (ConnectionRefusedError")
               for line in incident.cause.evidence), incident.cause.evidence


def test_a_plan_that_does_not_heal_is_followed_by_the_next_offered() -> None:
    """The model takes the restart offered beside a linked drop-in (a wrong
    guess: the start fails the same way); the incident then tries the
    rules' undo, which heals. Both tries are in the incident's phases; the
    restart is in `tried`, the undo is its plan."""
    fakes = Fakes()
    fakes.changes = [Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit="a.service",
                            path="/etc/systemd/system/a.service.d/bad.conf")]
    verdicts = iter([False, True])

    async def restart_please(unit: str, findings: list[str], cause: str, journal: list[str],
                             offered: list[Plan]) -> Plan:
        fakes.offered.append([p.describe() for p in offered])
        return next(p for p in offered if p.describe() == "unit_restart")

    async def verify(unit: str, hold_usec: int) -> bool:
        return next(verdicts)

    phases = fakes.phases(decide=restart_please)
    incident = run(Phases(context=phases.context, lease=phases.lease, decide=phases.decide,
                          execute=phases.execute, verify=verify, release=phases.release))
    assert fakes.offered == [["revert_dropin", "unit_restart", "nothing"]]
    assert [p.describe() for p in fakes.executed] == ["unit_restart", "revert_dropin"]
    assert (incident.result, incident.decided_by) == ("healed", "model")
    assert incident.tried == ["unit_restart"]
    assert [s.tool for s in incident.plan] == ["revert_dropin"]
    assert [(p.name, p.outcome, p.detail.split(":")[0]) for p in incident.phases
            if p.name in ("execute", "verify")] == [
        ("execute", "ok", "try 1"), ("verify", "ok", "try 1"),
        ("execute", "ok", "try 2"), ("verify", "ok", "try 2")]
    assert "tried unit_restart (not healed)" in incident.summary


def test_at_most_three_plans_are_tried_and_nothing_is_never_one() -> None:
    fakes = Fakes()
    fakes.unit = UnitFacts(unit="a.service", active_enter_usec=FAIL - 3600 * S,
                           inactive_exit_usec=FAIL - 2 * S, need_daemon_reload=True,
                           cache_dirs=("/var/cache/a",))
    fakes.changes = [Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit="a.service",
                            path="/etc/systemd/system/a.service.d/bad.conf")]
    fakes.active = False
    incident = run(fakes.phases())
    assert len(fakes.offered[0]) == 5  # reload, undo, restart, clear, nothing
    assert len(fakes.executed) == 3 and incident.result == "failed"
    assert all(p.steps for p in fakes.executed)
