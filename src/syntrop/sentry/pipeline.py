"""The triage pipeline: context → gang → lease → decide → execute → verify
→ release, each phase under its own hard budget (asyncio.timeout).

Design note: the phases are injected async callables, so this module does
no I/O of its own (service.py wires them to the daemons, tests to fakes).
A phase that overruns or fails never stops the triage: without context the
rules decide on what they have; without a lease the model is not asked;
when the model cannot decide (Runtime1 missing, a timeout, a bad answer)
the rules decide and the incident says decided_by=rules. The model may
also choose `none`: nothing is executed. The gang phase (when wired) runs
when the context has kernel or journal lines: it quarantines faulty GPU
planes, and the triage goes on. The release phase always runs when a lease
was taken.
"""

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from syntrop.sentry import rules
from syntrop.sentry.rules import NONE, Change, Decision

logger = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], int]
MS = 1_000


def wall_clock_usec() -> int:
    return time.time_ns() // 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What the context phase learnt."""

    failure_usec: int
    changes: list[Change] = field(default_factory=list)
    #: The unit's journal lines around the failure (messages).
    journal: list[str] = field(default_factory=list)
    summary: str = ""

    def kernel_lines(self) -> list[str]:
        """What gang triage reads: kernel events' summaries and the journal."""
        return [c.summary for c in self.changes if c.kind == "kernel" and c.summary] + \
            self.journal


@dataclass(frozen=True, slots=True, kw_only=True)
class Executed:
    """What the execute phase reports: toold's outcome and message."""

    outcome: str
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Phases:
    """The phases' I/O."""

    context: Callable[[str, int], Awaitable[Facts]]
    lease: Callable[[str], Awaitable[str]]
    decide: Callable[[str, Facts], Awaitable[Decision]]
    execute: Callable[[Decision], Awaitable[Executed]]
    verify: Callable[[str], Awaitable[bool]]
    release: Callable[[str], Awaitable[None]]
    #: Gang triage: quarantines faulty planes, returns what it did in words.
    gang: Callable[[str, Facts], Awaitable[str]] | None = None
    #: What the model had answered so far, for a decide phase that overran.
    decide_progress: Callable[[], str] | None = None


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
    execute_usec: int = 30_000 * MS
    verify_usec: int = 10_000 * MS
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
    decision: str | None
    decided_by: str | None
    result: str
    phases: list[PhaseRecord]
    summary: str


def new_id() -> str:
    return uuid.uuid4().hex


def encode(decision: Decision | None) -> str | None:
    if decision is None:
        return None
    return json.dumps({"tool": decision.tool, "parameters": decision.parameters},
                      sort_keys=True)


class _Run:
    """One triage's bookkeeping."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.phases: list[PhaseRecord] = []

    async def phase(self, name: str, budget_usec: int, call: Callable[[], Awaitable[T]],
                    describe: Callable[[Any], str] = str,
                    progress: Callable[[], str] | None = None) -> tuple[bool, T | None]:
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
        if not done:
            _abandon(task)
            so_far = progress() if progress is not None else ""
            self._add(name, started, budget_usec, "timeout",
                      f"over its budget of {budget_usec // MS} ms" + (f"; {so_far}" if so_far
                                                                     else ""))
            return False, None
        try:
            value = task.result()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a phase's failure must not stop the triage
            logger.debug("phase %s failed: %r", name, error)
            self._add(name, started, budget_usec, "failed", _short(error))
            return False, None
        self._add(name, started, budget_usec, "ok", describe(value))
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


async def triage(unit: str, trigger: str, *, phases: Phases, budgets: Budgets, clock: Clock,
                 detected_usec: int, breaker_open: bool = False,
                 recent_usec: int = rules.DEFAULT_RECENT_USEC,
                 incident_id: str | None = None) -> IncidentRecord:
    """Run one triage to its end; never raises for a phase's failure."""
    run = _Run(clock)
    ident = incident_id or new_id()
    if breaker_open:
        for name, budget in _names(budgets):
            run.skip(name, budget, "breaker open")
        return IncidentRecord(
            id=ident, unit=unit, detected_usec=detected_usec, trigger=trigger,
            decision=None, decided_by=None, result="breaker_open", phases=run.phases,
            summary=f"{unit}: breaker open, left alone")

    ok, facts = await run.phase(
        "context", budgets.context_usec, lambda: phases.context(unit, detected_usec),
        lambda f: f.summary or f"{len(f.changes)} changes")
    if facts is None:
        facts = Facts(failure_usec=detected_usec)
    if phases.gang is not None:
        gang, known_facts = phases.gang, facts
        if facts.kernel_lines():
            await run.phase("gang", budgets.gang_usec, lambda: gang(unit, known_facts))
        else:
            run.skip("gang", budgets.gang_usec, "no kernel or journal lines")

    got_lease, lease_id = await run.phase("lease", budgets.lease_usec,
                                          lambda: phases.lease(unit))
    decision: Decision | None = None
    decided_by = "rules"
    if got_lease:
        known = facts
        ok, decision = await run.phase(
            "decide", budgets.decide_usec, lambda: phases.decide(unit, known),
            lambda d: f"model chose {encode(d)}; {d.reason}", phases.decide_progress)
        if ok and decision is not None:
            decided_by = "model"
    else:
        run.skip("decide", budgets.decide_usec, "no lease: the model is not asked")
    if decision is None:
        decision = rules.decide(unit, facts.changes, facts.failure_usec, breaker_open=False,
                                recent_usec=recent_usec)

    healed = False
    executed: Executed | None = None
    if decision is None or decision.tool == NONE:
        why = "the model chose no action" if decision else "no action"
        run.skip("execute", budgets.execute_usec, why)
        run.skip("verify", budgets.verify_usec, why)
    else:
        chosen = decision
        ok, executed = await run.phase(
            "execute", budgets.execute_usec, lambda: phases.execute(chosen),
            lambda e: f"{e.outcome}: {e.message}")
        if ok:
            ok, active = await run.phase("verify", budgets.verify_usec,
                                         lambda: phases.verify(unit),
                                         lambda a: "active" if a else "not active")
            healed = bool(ok and active)
        else:
            run.skip("verify", budgets.verify_usec, "nothing was executed")

    if got_lease and lease_id is not None:
        held = lease_id
        await run.phase("release", budgets.release_usec, lambda: phases.release(held),
                        lambda _: f"lease {held} released")
    else:
        run.skip("release", budgets.release_usec, "no lease held")

    result = "healed" if healed else "failed"
    if decision is not None and decision.tool == NONE:
        result = "left_alone"
    action = decision.tool if decision else "nothing"
    how = executed.outcome if executed else "not run"
    summary = f"{unit}: {trigger}; {decided_by} chose {action} ({how}); {result}"
    return IncidentRecord(
        id=ident, unit=unit, detected_usec=detected_usec, trigger=trigger,
        decision=encode(decision), decided_by=decided_by if decision else None,
        result=result, phases=run.phases, summary=summary)


def _names(budgets: Budgets) -> list[tuple[str, int]]:
    return [("context", budgets.context_usec), ("gang", budgets.gang_usec),
            ("lease", budgets.lease_usec),
            ("decide", budgets.decide_usec), ("execute", budgets.execute_usec),
            ("verify", budgets.verify_usec), ("release", budgets.release_usec)]
