"""io.syntrop.Tool1: typed, allowlisted, sandboxed, reversible actions (toold)."""

from dataclasses import dataclass
from typing import Any, TypedDict

from asyncvarlink import TypedVarlinkErrorReply

from syntrop.interfaces import names
from syntrop.varlink.authz import not_authorized
from syntrop.varlink.contract import Interface, method

NAME = names.TOOL


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolParameter:
    """One typed parameter of a tool.

    Fields:
        name: Parameter name.
        type: string, int or bool.
        description: What it means.
        required: Whether it must be given.
        pattern: Regular expression a string value must match, if any.
        choices: The values a string may take, if limited.
        minimum: The smallest int accepted, if limited.
        maximum: The largest int accepted, if limited.
    """

    name: str
    type: str
    description: str
    required: bool
    pattern: str | None
    choices: list[str] | None = None
    minimum: int | None = None
    maximum: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolInfo:
    """A tool toold can run.

    Fields:
        name: daemon_reload, unit_restart, revert_dropin, revert_config,
            clear_cache, free_space or downgrade_package.
        description: What it does.
        risk: safe, remediation or maintenance.
        reversible: Whether it snapshots and can roll back.
        parameters: Its parameters.
        sandbox: The sandbox layers its tool processes run under; empty when
            it starts none (it only calls systemd over D-Bus).
        rollback: How it is undone, in words.
    """

    name: str
    description: str
    risk: str
    reversible: bool
    parameters: list[ToolParameter]
    sandbox: list[str] | None = None
    rollback: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord:
    """One entry of the append-only audit log.

    Fields:
        id: Sequence number.
        timestamp_usec: When the request came.
        uid: Caller's uid.
        pid: Caller's pid.
        tool: The tool.
        parameters: The parameters as given.
        dry_run: Whether it was a dry run.
        decision: allowed, refused or rate_limited.
        sandbox: Sandbox layers applied (bubblewrap, landlock, seccomp).
        outcome: succeeded, failed, rolled_back or not_run for a finished
            action; interrupted when toold stopped before it finished.
        message: What happened, in words.
        unit: The unit acted on, when the tool takes one.
        error: The declared error a refused request got, when it got one.
        rolled_back: Whether an automatic rollback happened.
        finished_usec: When the action finished; null while it runs or when
            it was interrupted.
        details: Tool-specific facts: job results, unit states before and
            after, the snapshot taken, files changed, bytes removed.
    """

    id: int
    timestamp_usec: int
    uid: int
    pid: int
    tool: str
    parameters: Any
    dry_run: bool
    decision: str
    sandbox: list[str]
    outcome: str
    message: str
    unit: str | None = None
    error: str | None = None
    rolled_back: bool | None = None
    finished_usec: int | None = None
    details: Any = None


class ExecuteResult(TypedDict):
    action_id: int
    plan: list[str]
    outcome: str
    rolled_back: bool
    sandbox: list[str]
    message: str
    unit: str | None
    job_result: str | None
    active_state: str | None
    previous_active_state: str | None
    details: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanStep:
    """One step of a plan: a tool call as Execute takes it.

    Fields:
        tool: The tool's name.
        parameters: An object of the tool's typed parameters.
    """

    tool: str
    parameters: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """How one step of a plan went.

    Fields:
        tool: The tool.
        action_id: Its audit record; null when it was not run.
        outcome: succeeded, failed, rolled_back, refused (a declared error
            when it came to run it) or not_run (an earlier step failed).
        message: What happened, in words.
        error: The declared error a refused step got.
        job_result: The systemd job's result, when a job was queued.
        active_state: The unit's ActiveState after the step.
    """

    tool: str
    action_id: int | None
    outcome: str
    message: str
    error: str | None = None
    job_result: str | None = None
    active_state: str | None = None


class PlanResult(TypedDict):
    outcome: str
    steps: list[StepResult]
    message: str


class ToolNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No tool has this name.

    Parameters:
        tool: The name given.
    """

    class Parameters:
        tool: str


class InvalidArgument(TypedVarlinkErrorReply, interface=NAME):
    """A tool parameter is missing, unknown, of the wrong type or fails its
    pattern. Nothing was run.

    Parameters:
        tool: The tool.
        parameter: The parameter.
        reason: What is wrong.
    """

    class Parameters:
        tool: str
        parameter: str
        reason: str


class UnitNotAllowed(TypedVarlinkErrorReply, interface=NAME):
    """The unit is outside the configured allowlist (or on the denylist).

    Parameters:
        unit: The unit.
    """

    class Parameters:
        unit: str


class RateLimited(TypedVarlinkErrorReply, interface=NAME):
    """Too many actions on this unit (or overall) recently.

    Parameters:
        unit: The unit, or empty for the global limit.
        retry_after_usec: When the next action would be allowed.
    """

    class Parameters:
        unit: str
        retry_after_usec: int


class SandboxUnavailable(TypedVarlinkErrorReply, interface=NAME):
    """A required sandbox layer cannot be applied here and config does not
    allow a weaker mode.

    Parameters:
        layer: bubblewrap, landlock or seccomp.
        reason: Why it is unavailable.
    """

    class Parameters:
        layer: str
        reason: str


class UnitBusy(TypedVarlinkErrorReply, interface=NAME):
    """Another action on the same unit is in progress.

    Parameters:
        unit: The unit.
    """

    class Parameters:
        unit: str


class UnitNotFound(TypedVarlinkErrorReply, interface=NAME):
    """systemd does not know the unit (its LoadState is not-found). Nothing
    was run.

    Parameters:
        unit: The unit.
    """

    class Parameters:
        unit: str


class UnsafePath(TypedVarlinkErrorReply, interface=NAME):
    """A path the tool would write is a symlink, not a directory, or
    otherwise unsafe to touch. Nothing was changed.

    Parameters:
        path: The path.
        reason: What is wrong with it.
    """

    class Parameters:
        path: str
        reason: str


class NoPreviousVersion(TypedVarlinkErrorReply, interface=NAME):
    """No earlier version is known to put back: neither contextd's history
    nor toold's own snapshots know one of the unit's drop-ins or config
    file, or (downgrade_package) the package cache holds no version of the
    package lower than the installed one. Nothing was changed.

    Parameters:
        unit: The unit.
        reason: What was looked at.
    """

    class Parameters:
        unit: str
        reason: str


class SystemdUnavailable(TypedVarlinkErrorReply, interface=NAME):
    """systemd cannot be reached over D-Bus. Nothing was run.

    Parameters:
        reason: Why.
    """

    class Parameters:
        reason: str


class PlanRefused(TypedVarlinkErrorReply, interface=NAME):
    """A plan refused before any of its steps ran (and audited).

    Parameters:
        reason: no_steps, too_many_steps, unknown_tool, invalid_step (its
            parameters fail the tool's declaration), other_unit (a step for
            a unit other than the plan's) or unit_not_allowed.
        step: The offending step (0-based), when one is.
        message: What is wrong, in words.
    """

    class Parameters:
        reason: str
        step: int | None
        message: str


NotAuthorized = not_authorized(NAME)


class Tool1(Interface, name=NAME):
    """A few typed, allowlisted, sandboxed, reversible remediation actions."""

    errors = (
        ToolNotFound,
        InvalidArgument,
        UnitNotAllowed,
        RateLimited,
        SandboxUnavailable,
        UnitBusy,
        UnitNotFound,
        UnsafePath,
        NoPreviousVersion,
        SystemdUnavailable,
        PlanRefused,
        NotAuthorized,
    )

    @method(return_parameter="tools")
    def ListTools(self) -> list[ToolInfo]:
        """Describe every tool with its parameters and risk.

        Returns:
            tools: The tools.
        """

    @method(allow_foreign=True)
    def Execute(
        self, *, tool: str, parameters: Any, dry_run: bool | None = None
    ) -> ExecuteResult:
        """Run a tool. Allowed to root and the configured sentry identity
        (others get org.varlink.service.PermissionDenied). Every request,
        refused or not, is audited. A malformed parameter object answers
        InvalidArgument naming the parameter.

        Parameters:
            tool: The tool's name.
            parameters: An object of the tool's typed parameters.
            dry_run: Only say what would be done.

        Returns:
            action_id: The audit record of this action.
            plan: The steps, in order (what would be done, for a dry run).
            outcome: succeeded, failed, rolled_back or not_run.
            rolled_back: Whether an automatic rollback happened.
            sandbox: Sandbox layers applied to the tool processes of this
                action (empty when the tool starts none: daemon_reload and
                unit_restart are one D-Bus call each).
            message: What happened, in words.
            unit: The unit acted on, when the tool takes one.
            job_result: The systemd job's result (done, failed, canceled,
                timeout, dependency, skipped, or timeout_waiting), when a job
                was queued.
            active_state: The unit's ActiveState at the end.
            previous_active_state: Its ActiveState before the action.
            details: Tool-specific facts, as in the audit record.
        """

    @method(allow_foreign=True)
    def ExecutePlan(
        self, *, unit: str, steps: list[PlanStep], dry_run: bool | None = None
    ) -> PlanResult:
        """Run a short plan on one unit, step by step, each as Execute runs
        it (and audited as such); a step that does not succeed stops the
        plan. The whole plan is checked before anything runs: at most 4
        steps, known tools, valid parameters, no step for another unit (a
        tool without a unit, daemon_reload, acts on the manager), the unit
        allowed; otherwise PlanRefused, audited, and nothing is done.

        Parameters:
            unit: The unit the plan is for.
            steps: The steps, in order.
            dry_run: Only check every step and say what each would do.

        Returns:
            outcome: succeeded (every step did), failed (a step did not; the
                later ones were not run) or not_run (a dry run).
            steps: Each step's result, in order.
            message: What happened, in words.
        """

    @method(return_parameter="records", allow_foreign=True)
    def GetAudit(self, *, limit: int | None = None, unit: str | None = None) -> list[AuditRecord]:
        """Read the audit log, newest last. Allowed to root and the sentry
        identity.

        Parameters:
            limit: At most this many records.
            unit: Only actions on this unit.

        Returns:
            records: The records.
        """
