"""The triage pipeline: context → gang → lease → decide → execute → verify
→ release, each phase under its own hard budget.

Design note: the phases are injected async callables, so this module does
no I/O of its own (service.py wires them to the daemons, tests to fakes).
Between context and lease the rules run (findings.py, pure): the findings
of the evidence, the cause, and the rules' plan. A phase that overruns or
fails never stops the triage: without context the rules plan on what they
have; without a lease the model is not asked; when the model cannot
decide (Runtime1 missing, a timeout, an answer that is not an offered
plan) the rules' plan stands and the incident says decided_by=rules. The
plan runs as one Tool1.ExecutePlan (each step audited by toold; the first
that fails stops it); verify holds the unit's state for longer than it
lived before failing. The release phase always runs when a lease was taken.

Results: healed (the plan ran and the unit stayed active through the
window), failed (it did not), needs_human (the cause is out of the tools'
reach and a restart, if one was due, did not heal it), waiting (a failed
dependency is triaged first), left_alone (the model chose no plan),
breaker_open, protected (set by the supervisor).
"""

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from syntrop.sentry import findings as rules
from syntrop.sentry import plans
from syntrop.sentry.findings import Cause, Change, Finding, Plan, UnitFacts

logger = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], int]
MS = 1_000
SECOND = 1_000_000
#: The tools toold had in this release, for when ListTools cannot be asked.
KNOWN_TOOLS = ("daemon_reload", "unit_restart", "revert_dropin", "clear_cache", "revert_config",
               "free_space", "downgrade_package")
#: Plans one incident tries before it gives up (try → verify → next).
MAX_TRIES = 3


def wall_clock_usec() -> int:
    return time.time_ns() // 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What the context phase learnt: contextd's timeline and journal slice,
    systemd's view of the unit, and the tools toold offers."""

    failure_usec: int
    changes: list[Change] = field(default_factory=list)
    #: The unit's journal lines around the failure (messages).
    journal: list[str] = field(default_factory=list)
    summary: str = ""
    unit: UnitFacts | None = None
    tools: tuple[str, ...] = KNOWN_TOOLS
    #: What could not be read ("contextd's timeline: TimeoutError"): a
    #: cause found without it says so.
    unread: tuple[str, ...] = ()

    def kernel_lines(self) -> list[str]:
        """What gang triage reads: kernel events' summaries and the journal."""
        return [c.summary for c in self.changes if c.kind == "kernel" and c.summary] + \
            self.journal


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """A step of the incident's plan and how it went (not_run when an
    earlier step failed or nothing ran)."""

    tool: str
    parameters: dict[str, Any]
    outcome: str = "not_run"
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Executed:
    """What the execute phase reports: the plan's outcome and each step's."""

    outcome: str
    message: str = ""
    steps: list[StepRecord] = field(default_factory=list)
    #: toold's reason when it refused the plan (outcome "refused"):
    #: unit_not_allowed, invalid_step, ...
    refused: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Phases:
    """The phases' I/O."""

    context: Callable[[str, int], Awaitable[Facts]]
    lease: Callable[[str], Awaitable[str]]
    #: The model's choice among the offered plans (the unit, the evidence
    #: and cause in words, the plans).
    decide: Callable[[str, list[str], str, list[str], list[Plan]], Awaitable[Plan]]
    execute: Callable[[str, Plan], Awaitable[Executed]]
    #: Whether the unit is active and stays so for the hold (microseconds).
    verify: Callable[[str, int], Awaitable[bool]]
    release: Callable[[str], Awaitable[None]]
    #: Gang triage: quarantines faulty planes, returns what it did in words.
    gang: Callable[[str, Facts], Awaitable[str]] | None = None
    #: What the model had answered so far, for a decide phase that overran.
    decide_progress: Callable[[], str] | None = None
    #: Makes the model ready to be asked (the warm session open with its
    #: prefix); says how. decide's budget starts once it returns.
    decide_ready: Callable[[], Awaitable[str]] | None = None
    #: Tokens the model has produced so far in this decide.
    decide_tokens: Callable[[], int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Budgets:
    """Hard budget of each phase, microseconds. The seed's 200 ms covers
    everything but the model's decoding, the action and the verification
    window; context and lease get more because contextd and inferenced may
    be socket-activated from cold (about 0.5 s measured), see docs/sentry.md."""

    context_usec: int = 1_000 * MS
    gang_usec: int = 1_000 * MS
    lease_usec: int = 1_000 * MS
    decide_usec: int = 1_800 * MS
    #: How long decide waits for the model to be ready (a session being
    #: opened or reopened) before its own budget starts.
    decide_ready_usec: int = 20_000 * MS
    execute_usec: int = 30_000 * MS
    verify_usec: int = 15_000 * MS
    release_usec: int = 500 * MS


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseRecord:
    name: str
    started_usec: int
    duration_usec: int
    budget_usec: int
    outcome: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentRecord:
    id: str
    unit: str
    detected_usec: int
    trigger: str
    #: The plan's first step as a Tool1 call, JSON (None: no step).
    decision: str | None
    decided_by: str | None
    result: str
    phases: list[PhaseRecord]
    summary: str
    cause: Cause | None = None
    plan: list[StepRecord] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    #: findings.ran_well_since at this failure: the supervisor hands it to
    #: the unit's next triage (not stored).
    ran_well_usec: int = 0
    #: Plans (Plan.describe()) this incident ran that did not heal the unit,
    #: in order (not stored: the phases and the summary say the same).
    tried: list[str] = field(default_factory=list)


def new_id() -> str:
    # 128 random bits, as uuid4().hex: uuid's import costs a cold start
    # ~4 ms (it imports platform), for what os.urandom gives.
    return os.urandom(16).hex()


def encode(plan: Plan | None) -> str | None:
    """The plan's first step, as the incident's `decision` has always said."""
    if plan is None or not plan.steps:
        return None
    return json.dumps(plan.steps[0].wire(), sort_keys=True)


class _Run:
    """One triage's bookkeeping."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.phases: list[PhaseRecord] = []

    async def phase(self, name: str, budget_usec: int, call: Callable[[], Awaitable[T]],
                    describe: Callable[[Any], str] = str,
                    progress: Callable[[], str] | None = None,
                    extend: Callable[[], bool] | None = None) -> tuple[bool, T | None]:
        """Run `call` under `budget_usec`; when it overruns and `extend()`
        says so, it gets one more budget."""
        started = self.clock()
        # The phase runs as a task of its own and is waited for with a
        # timeout, rather than cancelled from inside by asyncio.timeout: a
        # cancellation that races a ready result inside asyncio.wait_for
        # (Python 3.11, e.g. a streamed Chat reply) is lost, and the budget
        # with it. Here the budget holds whatever the phase does.
        task: asyncio.Future[T] = asyncio.ensure_future(call())
        try:
            done, _ = await asyncio.wait({task}, timeout=budget_usec / 1e6)
        except asyncio.CancelledError:
            task.cancel()
            raise
        extended = False
        if not done and extend is not None and extend():
            extended = True
            try:
                done, _ = await asyncio.wait({task}, timeout=budget_usec / 1e6)
            except asyncio.CancelledError:
                task.cancel()
                raise
        more = " (extended once: the model was answering)" if extended else ""
        if not done:
            _abandon(task)
            so_far = progress() if progress is not None else ""
            self._add(name, started, budget_usec, "timeout",
                      f"over its budget of {budget_usec // MS} ms{more}"
                      + (f"; {so_far}" if so_far else ""))
            return False, None
        try:
            value = task.result()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a phase's failure must not stop the triage
            logger.debug("phase %s failed: %r", name, error)
            self._add(name, started, budget_usec, "failed", _short(error) + more)
            return False, None
        self._add(name, started, budget_usec, "ok", describe(value) + more)
        return True, value

    def skip(self, name: str, budget_usec: int, why: str) -> None:
        self._add(name, self.clock(), budget_usec, "skipped", why)

    def _add(self, name: str, started: int, budget: int, outcome: str, detail: str) -> None:
        self.phases.append(PhaseRecord(
            name=name, started_usec=started, duration_usec=max(self.clock() - started, 0),
            budget_usec=budget, outcome=outcome, detail=detail[:500]))


_ABANDONED: set[asyncio.Future[Any]] = set()


def _abandon(task: asyncio.Future[Any]) -> None:
    """Cancel an overrun phase and let it end on its own (its outcome, if it
    ever has one, is dropped)."""
    task.cancel()
    _ABANDONED.add(task)

    def dropped(done: asyncio.Future[Any]) -> None:
        _ABANDONED.discard(done)
        if not done.cancelled():
            done.exception()  # retrieved: never "exception was never retrieved"

    task.add_done_callback(dropped)


def _short(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if text != type(error).__name__ else text


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """What the triage is allowed, from configuration and the breaker."""

    #: Earlier remediations of this unit in the breaker's window.
    attempts: int = 0
    #: How long a healed unit must stay active, at least and at most.
    hold_min_usec: int = 5 * SECOND
    hold_max_usec: int = 12 * SECOND
    #: The start of the unit's last run that went well, as an earlier
    #: triage saw it (findings.UnitFacts.ran_well_usec).
    ran_well_usec: int = 0
    #: Plans (Plan.describe()) that ran on this unit in the breaker's window
    #: and did not heal it. Such a plan is not run again: the next one is.
    tried: frozenset[str] = frozenset()


def _plan_steps(plan: Plan, executed: Executed | None) -> list[StepRecord]:
    if executed is not None and executed.steps:
        return executed.steps
    return [StepRecord(tool=step.tool, parameters=dict(step.parameters)) for step in plan.steps]


def _ran(steps: list[StepRecord]) -> str:
    if not steps:
        return "nothing ran"
    return "; ".join(f"{s.tool} {s.outcome}" + (f" ({s.message})" if s.message and
                                                s.outcome != "not_run" else "")
                     for s in steps)


def extends(plan: Plan, tokens: int) -> bool:
    """Whether a decide that overran its budget gets one more: only while
    the model is producing tokens, and only when the rules' plan is "a
    human must" (the empty plan). A fixable plan of the rules' never waits
    for the model."""
    return tokens > 0 and not plan.steps


async def _decide(run: _Run, phases: Phases, budgets: Budgets, plan: Plan,
                  call: Callable[[], Awaitable[Plan]]) -> Plan | None:
    """The decide phase: the model made ready (under its own wait, not
    decide's budget), then asked under decide's budget, extended once as
    `extends` says. The model's plan, or None: the rules' plan stands."""
    ready = ""
    if phases.decide_ready is not None:
        ok, how = await run.phase("decide", budgets.decide_ready_usec, phases.decide_ready,
                                  progress=lambda: "the model was not ready")
        if not ok:
            return None
        waited = run.phases.pop()  # one record: the model's part, with the wait in words
        ready = f"; {how}, ready after {waited.duration_usec // MS} ms"
    tokens = phases.decide_tokens
    ok, chosen = await run.phase(
        "decide", budgets.decide_usec, call,
        lambda p: f"model chose {p.describe()}; {p.reason}{ready}", phases.decide_progress,
        extend=None if tokens is None else lambda: extends(plan, tokens()))
    return chosen if ok else None


def _untried(offered: list[Plan], plan: Plan, tried: frozenset[str]
             ) -> tuple[list[Plan], Plan, bool]:
    """The plans not tried earlier in the window, the plan to run (the
    rules' own, unless it was tried: then the next untried one), and
    whether none is left."""
    if not tried:
        return offered, plan, False
    offered = [p for p in offered if not p.steps or p.describe() not in tried]
    if plan.steps and plan.describe() in tried:
        failed = plan.describe()
        plan = next((p for p in offered if p.steps), Plan(
            reason=f"{failed} did not heal it earlier in the window; a human must"))
        return offered, plan, not plan.steps
    return offered, plan, False


def _protected(unit: str, found: Cause, executed: Executed) -> Cause:
    """toold refused the plan because the unit is on its deny list: no tool
    may touch the unit, whatever the rules found."""
    return Cause(kind=rules.PROTECTED, fixable=False, subject=unit,
                 summary=f"{unit} is protected: toold refused the plan ({executed.message})",
                 evidence=(f"toold: {executed.message}", f"the rules found: {found.summary}",
                           *found.evidence))


def _result(healed: bool, plan: Plan, decided_by: str, cause: Cause, exhausted: bool) -> str:
    """An incident's result, from how it ended."""
    if healed:
        return "healed"
    if not plan.steps and decided_by == "model":
        return "left_alone"
    if not plan.steps and cause.kind == rules.DEPENDENCY:
        return "waiting"
    if not cause.fixable or exhausted:
        return "needs_human"
    return "failed"


async def triage(unit: str, trigger: str, *, phases: Phases, budgets: Budgets, clock: Clock,
                 detected_usec: int, breaker_open: bool = False,
                 policy: Policy | None = None,
                 incident_id: str | None = None) -> IncidentRecord:
    """Run one triage to its end; never raises for a phase's failure."""
    policy = policy or Policy()
    run = _Run(clock)
    ident = incident_id or new_id()
    if breaker_open:
        for name, budget in _names(budgets):
            run.skip(name, budget, "breaker open")
        return IncidentRecord(
            id=ident, unit=unit, detected_usec=detected_usec, trigger=trigger,
            decision=None, decided_by=None, result="breaker_open", phases=run.phases,
            summary=f"{unit}: breaker open, left alone")

    _, facts = await run.phase(
        "context", budgets.context_usec, lambda: phases.context(unit, detected_usec),
        lambda f: f.summary or f"{len(f.changes)} changes")
    if facts is None:
        facts = Facts(failure_usec=detected_usec, unread=(
            f"the context phase: {run.phases[-1].outcome} ({run.phases[-1].detail})",))
    if phases.gang is not None:
        gang, known_facts = phases.gang, facts
        if facts.kernel_lines():
            await run.phase("gang", budgets.gang_usec, lambda: gang(unit, known_facts))
        else:
            run.skip("gang", budgets.gang_usec, "no kernel or journal lines")

    # The rules: findings, the cause, the plan (pure, no budget needed).
    unit_facts = replace(facts.unit or UnitFacts(unit=unit),
                         ran_well_usec=policy.ran_well_usec)
    found: list[Finding] = rules.find(unit, trigger, facts.changes, facts.journal, unit_facts,
                                      facts.failure_usec, attempts=policy.attempts)
    cause = rules.cause(found, facts.failure_usec)
    if facts.unread and cause.kind == rules.TRANSIENT:
        cause = replace(cause, summary=f"{cause.summary}, but not everything was read",
                        evidence=(*cause.evidence, *(f"not read: {u}" for u in facts.unread)))
    plan = plans.plan(cause, unit, facts.tools, unit_facts, restarted=policy.attempts > 0)
    lines = [f.line(facts.failure_usec) for f in found]

    got_lease, lease_id = await run.phase("lease", budgets.lease_usec,
                                          lambda: phases.lease(unit))
    decided_by = "rules"
    offered = plans.candidates(found, plan, cause, unit, facts.tools, unit_facts,
                               facts.failure_usec)
    offered, plan, exhausted = _untried(offered, plan, policy.tried)
    if got_lease and len(offered) > 1:
        chosen = await _decide(
            run, phases, budgets, plan,
            lambda: phases.decide(unit, lines, cause.summary, facts.journal, offered))
        if chosen is not None:
            plan, decided_by = chosen, "model"
    elif got_lease:
        run.skip("decide", budgets.decide_usec, f"one plan to offer: {plan.describe()}")
    else:
        run.skip("decide", budgets.decide_usec, "no lease: the model is not asked")

    healed = False
    executed: Executed | None = None
    tried: list[str] = []
    if not plan.steps:
        why = "the model chose no plan" if decided_by == "model" else plan.reason
        run.skip("execute", budgets.execute_usec, why)
        run.skip("verify", budgets.verify_usec, why)
    else:
        hold = rules.verify_hold_usec(unit_facts, facts.failure_usec,
                                      policy.hold_min_usec, policy.hold_max_usec)
        # Try → verify → next: the chosen plan, then the others offered, in
        # the rules' order, until one heals (at most MAX_TRIES).
        for attempt in _ranked(plan, offered)[:MAX_TRIES]:
            plan = attempt
            executed, healed = await _try(run, phases, budgets, unit, attempt, hold,
                                          f"try {len(tried) + 1}: ")
            if healed:
                break
            tried.append(attempt.describe())
            if executed is not None and executed.refused == "unit_not_allowed":
                cause = _protected(unit, cause, executed)
                break

    if got_lease and lease_id is not None:
        held = lease_id
        await run.phase("release", budgets.release_usec, lambda: phases.release(held),
                        lambda _: f"lease {held} released")
    else:
        run.skip("release", budgets.release_usec, "no lease held")

    steps = _plan_steps(plan, executed)
    result = _result(healed, plan, decided_by, cause, exhausted)
    before = f"tried {' then '.join(tried[:len(tried) - (0 if healed else 1)])} (not healed), " \
        if len(tried) > (0 if healed else 1) else ""
    summary = (f"{unit}: {trigger}; cause: {cause.summary}; {decided_by} planned "
               f"{plan.describe()}; {before}{_ran(steps) if plan.steps else plan.reason}; "
               f"{result}")
    return IncidentRecord(
        id=ident, unit=unit, detected_usec=detected_usec, trigger=trigger,
        decision=encode(plan), decided_by=decided_by, result=result, phases=run.phases,
        summary=summary, cause=cause, plan=steps, findings=lines,
        ran_well_usec=rules.ran_well_since(unit_facts, facts.failure_usec), tried=tried)


def _ranked(chosen: Plan, offered: list[Plan]) -> list[Plan]:
    """The plans to try in turn: the chosen one, then every other offered
    plan that acts, in the offer's order (the rules' first)."""
    return [chosen, *(p for p in offered if p.steps and p.steps != chosen.steps)]


async def _try(run: _Run, phases: Phases, budgets: Budgets, unit: str, plan: Plan, hold: int,
               label: str) -> tuple[Executed | None, bool]:
    """One try: the plan executed, then verified for `hold`. A try that does
    not heal leaves nothing to put back for the tools it may use: a restart
    or a reload change no file, and revert_dropin puts the directory back
    itself when the unit is worse after it (toold's rollback)."""
    ok, executed = await run.phase(
        "execute", budgets.execute_usec, lambda: phases.execute(unit, plan),
        lambda e: f"{label}{plan.describe()}: {e.outcome}: "
                  f"{_ran(e.steps) if e.steps else e.message}")
    if not (ok and executed is not None and executed.outcome == "succeeded"):
        run.skip("verify", budgets.verify_usec, f"{label}the plan did not succeed")
        return executed, False
    ok, active = await run.phase(
        "verify", budgets.verify_usec, lambda: phases.verify(unit, hold),
        lambda a: f"{label}active for {hold / SECOND:.1f} s" if a
        else f"{label}not active through {hold / SECOND:.1f} s")
    return executed, bool(ok and active)


def _names(budgets: Budgets) -> list[tuple[str, int]]:
    return [("context", budgets.context_usec), ("gang", budgets.gang_usec),
            ("lease", budgets.lease_usec),
            ("decide", budgets.decide_usec), ("execute", budgets.execute_usec),
            ("verify", budgets.verify_usec), ("release", budgets.release_usec)]
