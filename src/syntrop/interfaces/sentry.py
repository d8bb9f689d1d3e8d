"""io.syntrop.Sentry1: the self-healing loop's status and history."""

from dataclasses import dataclass
from typing import TypedDict

from asyncvarlink import TypedVarlinkErrorReply

from syntrop.interfaces import names
from syntrop.varlink.authz import not_authorized
from syntrop.varlink.contract import Interface, method

NAME = names.SENTRY


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """One phase of a triage.

    Fields:
        name: context, gang, lease, decide, execute, verify or release.
        started_usec: When it started, microseconds since the epoch.
        duration_usec: How long it took.
        budget_usec: Its hard time budget.
        outcome: ok, failed, timeout or skipped.
        detail: Inputs and result, summarised.
    """

    name: str
    started_usec: int
    duration_usec: int
    budget_usec: int
    outcome: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Cause:
    """What explains a failure, as sentry's rules named it.

    Fields:
        kind: dependency_failed, executable_missing, stale_definition,
            dropin_changed, stale_cache, stale_state, config_replaced (by a
            package), config_edited, unit_file_changed, resource_error (the
            journal names a resource that is taken or refused),
            unit_protected (toold refuses to act on the unit), crash_loop
            or transient (no change is linked to the failure).
        fixable: Whether syntrop's tools can remove it; when not, sentry
            restarts at most once, then leaves the unit to a human.
        summary: The cause in words.
        subject: The drop-in, file, program or unit concerned.
        package: The package, for config_replaced.
        evidence: What links it to the failure (journal lines, timings,
            systemd's job result), or, for transient, the changes found
            and why they are not blamed.
    """

    kind: str
    fixable: bool
    summary: str
    subject: str | None
    package: str | None
    evidence: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanStep:
    """One step of an incident's plan.

    Fields:
        tool: The Tool1 tool.
        parameters: Its parameters, JSON.
        outcome: succeeded, failed, rolled_back, refused, or not_run (an
            earlier step failed, or the plan did not run).
        message: What toold said of it.
    """

    tool: str
    parameters: str
    outcome: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Incident:
    """A unit failure and what sentry did about it.

    Fields:
        id: Incident identifier.
        unit: The failed unit.
        detected_usec: When the failure signal arrived.
        trigger: job_failed, job_timeout, job_dependency, state_failed, manual,
            changed (a unit still failed after its triage was started again
            or contextd recorded a change for it), episode_window (still
            failed when the breaker's window since its episode began ran out),
            dependency_of (a unit waits for this one) or dependency_healed
            (the dependency it waited for is healed: its start is retried).
        decision: The plan's first step as a Tool1.Execute call, JSON; null
            when the plan has none.
        decided_by: model or rules (the deterministic fallback).
        result: healed (active through the verification window), failed,
            needs_human (a cause no tool removes; at most one restart was
            tried), waiting (for a failed dependency's triage), left_alone
            (the model chose no plan), protected (no action by
            configuration), breaker_open, in_progress or interrupted
            (sentry stopped while triaging).
        phases: The phases with their timings.
        summary: One line for humans: the cause, the plan, what ran.
        cause: What explains the failure; null for breaker_open, protected
            and incidents from before causes were recorded.
        plan: The plan's steps, in order, with how each went.
        findings: Every finding, one line each (unlinked changes say so).
    """

    id: str
    unit: str
    detected_usec: int
    trigger: str
    decision: str | None
    decided_by: str | None
    result: str
    phases: list[Phase]
    summary: str
    cause: Cause | None = None
    plan: list[PlanStep] | None = None
    findings: list[str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Breaker:
    """The circuit breaker of one unit.

    Fields:
        unit: The unit.
        state: closed, open or needs_human.
        attempts: Triages in the current window (leaving a unit alone
            counts too).
        open_until_usec: When an open breaker lets the next attempt through.
    """

    unit: str
    state: str
    attempts: int
    open_until_usec: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Episode:
    """A unit that stayed failed after its triage: sentry does not triage
    it again until something changes.

    Fields:
        unit: The unit.
        since_usec: When the failure that began the episode was seen.
        triages: Incidents of this episode so far.
        results: Each incident's result, oldest first.
        waiting_for: What would triage it again, in words.
    """

    unit: str
    since_usec: int
    triages: int
    results: list[str]
    waiting_for: str


class StatusResult(TypedDict):
    state: str
    subscribed: bool
    open_incidents: int
    incidents_total: int
    breakers: list[Breaker]
    triage_session: str | None
    episodes: list[Episode]
    triage_model: str | None


class IncidentNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No incident has this identifier.

    Parameters:
        id: The identifier asked for.
    """

    class Parameters:
        id: str


class UnitIgnored(TypedVarlinkErrorReply, interface=NAME):
    """Sentry is configured to leave this unit alone.

    Parameters:
        unit: The unit.
    """

    class Parameters:
        unit: str


class BreakerOpen(TypedVarlinkErrorReply, interface=NAME):
    """The unit's circuit breaker is open; no action until it closes or is
    reset.

    Parameters:
        unit: The unit.
        open_until_usec: When it lets the next attempt through; 0 when it
            needs a human.
    """

    class Parameters:
        unit: str
        open_until_usec: int


class InvalidUnitName(TypedVarlinkErrorReply, interface=NAME):
    """Not a valid systemd unit name.

    Parameters:
        unit: The name given.
    """

    class Parameters:
        unit: str


NotAuthorized = not_authorized(NAME)


class Sentry1(Interface, name=NAME):
    """The supervisor of the self-healing loop: watches systemd, triages
    failures within hard budgets, never restarts anything forever."""

    errors = (IncidentNotFound, UnitIgnored, BreakerOpen, InvalidUnitName, NotAuthorized)

    @method
    def GetStatus(self) -> StatusResult:
        """Sentry's state and its breakers.

        Returns:
            state: watching, triaging or degraded.
            subscribed: Whether it receives systemd's signals.
            open_incidents: Incidents still in progress.
            incidents_total: Incidents since the store began.
            breakers: Breakers that are not closed.
            triage_session: The model's warm session: "ready: MODEL, N
                prefix tokens resident", "opening" or "failed: why"; null
                when sentry asks the model without one (warm_session =
                false).
            episodes: Units left failed after their triage, each waiting
                for a change before it is triaged again.
            triage_model: The model that decides now (chosen from what
                modeld holds), or null: no triage model, the rules decide.
        """

    @method(return_parameter="incidents")
    def ListIncidents(self, *, limit: int | None = None, unit: str | None = None) -> list[Incident]:
        """Incidents, newest last.

        Parameters:
            limit: At most this many.
            unit: Only this unit's.

        Returns:
            incidents: The incidents.
        """

    @method(return_parameter="incident")
    def GetIncident(self, *, id: str) -> Incident:
        """One incident in full.

        Parameters:
            id: The incident.

        Returns:
            incident: The incident.
        """

    @method(return_parameter="incident")
    def Triage(self, *, unit: str) -> Incident:
        """Triage a unit now, as if it had just failed.

        Parameters:
            unit: The unit.

        Returns:
            incident: The finished incident.
        """

    @method
    def ResetBreaker(self, *, unit: str) -> None:
        """Close a unit's breaker and forget its attempts, and the plans
        tried in the window that did not heal it (each is offered again).

        Parameters:
            unit: The unit.
        """
