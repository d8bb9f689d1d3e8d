"""The Varlink face of toold: io.syntrop.Tool1.

Execute, in order: who is calling (root, the sentry uid, or polkit's
io.syntrop.tool.execute; else NotAuthorized) → which tool → its
parameters (schema) → the unit's name and the allow/deny patterns → the
per-unit lock (busy: UnitBusy, never queued) → rate limits (not for dry
runs) → the tool's prepare (existence, path safety, sandbox layers,
previous version) → audit "allowed" → dry run: the plan; else execute →
audit the outcome. Every refusal is audited with the declared error it
got, and nothing is changed before the "allowed" row is on disk.
"""

import asyncio
import logging
from typing import Any

from syntrop.config import Paths
from syntrop.interfaces.tool import (
    AuditRecord,
    ExecuteResult,
    InvalidArgument,
    NoPreviousVersion,
    NotAuthorized,
    PlanRefused,
    PlanResult,
    PlanStep,
    RateLimited,
    SandboxUnavailable,
    StepResult,
    SystemdUnavailable,
    Tool1,
    ToolInfo,
    ToolNotFound,
    ToolParameter,
    UnitBusy,
    UnitNotAllowed,
    UnitNotFound,
    UnsafePath,
)
from syntrop.toold import errors, units
from syntrop.toold.audit import Audit
from syntrop.toold.config import Config, load
from syntrop.toold.context import Context, now_usec
from syntrop.toold.tools import TOOL_TYPES, Outcome, Tool
from syntrop.varlink import InvalidParameter, authz, current_peer, implements

logger = logging.getLogger(__name__)

MAX_AUDIT = 10_000
#: Most steps a plan may have.
MAX_PLAN_STEPS = 4


def _wire(error: errors.ToolError) -> Exception:
    """The declared Varlink error for a domain error."""
    f: dict[str, Any] = error.fields
    match error:
        case errors.UnknownTool():
            return ToolNotFound(tool=f["tool"])
        case errors.BadArgument():
            return InvalidArgument(tool=f["tool"], parameter=f["parameter"], reason=f["reason"])
        case errors.NotAllowed():
            return UnitNotAllowed(unit=f["unit"])
        case errors.NotFound():
            return UnitNotFound(unit=f["unit"])
        case errors.Busy():
            return UnitBusy(unit=f["unit"])
        case errors.Limited():
            return RateLimited(unit=f["unit"], retry_after_usec=f["retry_after_usec"])
        case errors.NoSandbox():
            return SandboxUnavailable(layer=f["layer"], reason=f["reason"])
        case errors.Unsafe():
            return UnsafePath(path=f["path"], reason=f["reason"])
        case errors.NoPrevious():
            return NoPreviousVersion(unit=f["unit"], reason=f["reason"])
        case errors.NoSystemd():
            return SystemdUnavailable(reason=f["reason"])
        case errors.Denied():
            return NotAuthorized(action=f["action"])
        case errors.PlanError():
            return PlanRefused(reason=f["reason"], step=f["step"], message=f["words"])
    raise AssertionError(f"unmapped domain error {error!r}")  # pragma: no cover


def info(tool: Tool) -> ToolInfo:
    return ToolInfo(
        name=tool.name, description=tool.description, risk=tool.risk,
        reversible=tool.reversible, rollback=tool.rollback,
        sandbox=["bubblewrap", "landlock", "seccomp"] if tool.sandboxed else [],
        parameters=[
            ToolParameter(name=p.name, type=p.type.__name__, description=p.description,
                          required=p.required, pattern=p.pattern,
                          choices=list(p.choices) if p.choices else None,
                          minimum=p.minimum, maximum=p.maximum)
            for p in tool.parameters
        ],
    )


class ToolService(Tool1):
    """Runs typed, sandboxed, reversible remediation actions."""

    def __init__(self, paths: Paths, config: Config | None = None) -> None:
        self.paths = paths
        self.config = config or load(paths.configuration / "toold.toml")
        if self.config.context_socket is None:
            from dataclasses import replace

            self.config = replace(self.config,
                                  context_socket=paths.runtime / "io.syntrop.Context1")
        self.audit = Audit(paths.state / "toold.db")
        self.context = Context(self.config, self.audit)
        self.tools: dict[str, Tool] = {name: kind() for name, kind in TOOL_TYPES.items()}
        self.busy: set[str] = set()
        self.running = 0

    def keep_alive(self) -> bool:
        return self.running > 0

    async def aclose(self) -> None:
        self.context.close()
        self.audit.close()

    # helpers -----------------------------------------------------------------

    async def _authorized(self) -> bool:
        """Root, toold's own uid, the sentry uid, or polkit's io.syntrop.tool.execute."""
        return await authz.allowed(authz.REMEDIATE, owner_uid=self.config.sentry_uid)

    @staticmethod
    def _denied() -> errors.Denied:
        return errors.Denied(f"not root or the sentry uid, and polkit did not authorize "
                             f"{authz.REMEDIATE}", action=authz.REMEDIATE)

    async def _refuse(self, error: errors.ToolError, *, tool: str, unit: str | None,
                      parameters: Any, dry_run: bool, decision: str = "refused") -> Exception:
        peer = current_peer()
        now = now_usec()
        action = await self.audit.request(now_usec=now, uid=peer.uid, pid=peer.pid, tool=tool,
                                          unit=unit, parameters=parameters, dry_run=dry_run,
                                          decision=decision, error=error.error)
        await self.audit.outcome(action, now_usec=now, sandbox=[], outcome="not_run",
                                 message=str(error))
        return _wire(error)

    async def _rate_check(self, unit: str | None) -> None:
        rate = self.config.rate
        now = now_usec()
        checks: list[tuple[str, str | None, int, float]] = [
            ("", None, rate.total, rate.total_window)]
        if unit is not None:
            checks.insert(0, (unit, unit, rate.per_unit, rate.per_unit_window))
        for label, key, limit, window in checks:
            recent = await self.audit.recent(key, now - int(window * 1e6))
            if len(recent) >= limit:
                retry = recent[-limit] + int(window * 1e6) - now
                raise errors.Limited(f"rate limit on {label or 'all units'}",
                                     unit=label, retry_after_usec=max(retry, 1))

    # methods -----------------------------------------------------------------

    @implements
    def ListTools(self) -> list[ToolInfo]:
        return [info(tool) for tool in self.tools.values()]

    @implements
    async def Execute(self, *, tool: str, parameters: Any,
                      dry_run: bool | None = None) -> ExecuteResult:
        return await self._execute(tool, parameters, bool(dry_run))

    async def _execute(self, tool: str, parameters: Any, dry: bool) -> ExecuteResult:
        unit = parameters.get("unit") if isinstance(parameters, dict) else None
        unit = unit if isinstance(unit, str) and units.syntax_error(unit) is None else None
        if not isinstance(tool, str) or len(tool) > 128:
            raise InvalidParameter(parameter="tool")
        if not await self._authorized():
            raise await self._refuse(self._denied(), tool=tool,
                                     unit=unit, parameters=parameters, dry_run=dry,
                                     decision="denied")
        key = None
        try:
            found = self.tools.get(tool)
            if found is None:
                raise errors.UnknownTool(f"no tool {tool!r}", tool=tool)
            args = found.validate(parameters)
            unit = args.get("unit")
            if unit is not None and not units.allowed(unit, self.config.allow, self.config.deny):
                raise errors.NotAllowed(f"{unit} is not allowed", unit=unit)
            key = unit or f"*{tool}"
            if key in self.busy:
                key, busy = None, key
                raise errors.Busy(f"an action on {busy} is running", unit=busy)
            self.busy.add(key)
            if not dry:
                await self._rate_check(unit)
            try:
                plan = await found.prepare(args, self.context)
            except OSError as error:
                # A file checked a moment ago changed under the check (a
                # drop-in directory removed meanwhile): refused, not crashed.
                raise errors.Unsafe(f"{error.filename or unit}: {error.strerror or error}",
                                    path=str(error.filename or ""),
                                    reason="it changed while it was being checked") from None
        except errors.ToolError as error:
            if key is not None:
                self.busy.discard(key)
            decision = "rate_limited" if isinstance(error, errors.Limited) else \
                "busy" if isinstance(error, errors.Busy) else "refused"
            raise await self._refuse(error, tool=tool, unit=unit, parameters=parameters,
                                     dry_run=dry, decision=decision) from None
        except BaseException:
            if key is not None:
                self.busy.discard(key)  # whatever failed, the unit is not left busy
            raise
        try:
            return await self._run(found, plan, parameters, dry)
        finally:
            self.busy.discard(key)

    async def _run(self, tool: Tool, plan: Any, parameters: Any, dry: bool) -> ExecuteResult:
        peer = current_peer()
        action = await self.audit.request(now_usec=now_usec(), uid=peer.uid, pid=peer.pid,
                                          tool=tool.name, unit=plan.unit,
                                          parameters=parameters, dry_run=dry,
                                          decision="allowed")
        if dry:
            outcome = Outcome(outcome="not_run", message="dry run: nothing was done",
                              details={"plan": plan.steps})
        else:
            self.running += 1
            self.context.action_id = action
            try:
                outcome = await tool.execute(plan, self.context)
            except BaseException as error:
                message = "cancelled" if isinstance(error, asyncio.CancelledError) \
                    else "internal error"
                await asyncio.shield(self.audit.outcome(
                    action, now_usec=now_usec(), sandbox=[], outcome="failed", message=message))
                raise
            finally:
                self.running -= 1
        await self.audit.outcome(action, now_usec=now_usec(), sandbox=outcome.sandbox,
                                 outcome=outcome.outcome, message=outcome.message,
                                 rolled_back=outcome.rolled_back,
                                 details={**outcome.details, "job_result": outcome.job_result,
                                          "active_state": outcome.active_state})
        logger.info("action %d: %s %s: %s", action, tool.name, plan.unit or "",
                    outcome.message)
        return ExecuteResult(
            action_id=action, plan=plan.steps, outcome=outcome.outcome,
            rolled_back=outcome.rolled_back, sandbox=outcome.sandbox, message=outcome.message,
            unit=plan.unit, job_result=outcome.job_result, active_state=outcome.active_state,
            previous_active_state=outcome.previous_active_state, details=outcome.details or None,
        )

    def _check_plan(self, unit: str, steps: list[PlanStep]) -> None:
        """Every step checked before any runs (PlanError otherwise)."""
        def refuse(reason: str, message: str, step: int | None = None) -> errors.PlanError:
            return errors.PlanError(message, reason=reason, step=step, words=message)

        if not steps:
            raise refuse("no_steps", "a plan needs at least one step")
        if len(steps) > MAX_PLAN_STEPS:
            raise refuse("too_many_steps", f"{len(steps)} steps; at most {MAX_PLAN_STEPS}")
        if units.syntax_error(unit) is not None or \
                not units.allowed(unit, self.config.allow, self.config.deny):
            raise refuse("unit_not_allowed", f"{unit} is not allowed")
        for index, step in enumerate(steps):
            found = self.tools.get(step.tool) if isinstance(step.tool, str) else None
            if found is None:
                raise refuse("unknown_tool", f"step {index}: no tool {step.tool!r}", index)
            try:
                args = found.validate(step.parameters)
            except errors.ToolError as error:
                raise refuse("invalid_step", f"step {index}: {error}", index) from None
            if args.get("unit", unit) != unit:
                raise refuse("other_unit", f"step {index}: {step.tool} for {args['unit']}, "
                                           f"not {unit}", index)

    @implements
    async def ExecutePlan(self, *, unit: str, steps: list[PlanStep],
                          dry_run: bool | None = None) -> PlanResult:
        if not isinstance(unit, str) or len(unit) > units.MAX:
            raise InvalidParameter(parameter="unit")
        described = {"unit": unit, "steps": [{"tool": s.tool, "parameters": s.parameters}
                                              for s in steps[:MAX_PLAN_STEPS + 1]]}
        if not await self._authorized():
            raise await self._refuse(self._denied(), tool="plan",
                                     unit=unit, parameters=described, dry_run=bool(dry_run),
                                     decision="denied")
        try:
            self._check_plan(unit, steps)
        except errors.PlanError as error:
            raise await self._refuse(error, tool="plan", unit=unit, parameters=described,
                                     dry_run=bool(dry_run)) from None
        results: list[StepResult] = []
        outcome = "not_run" if dry_run else "succeeded"
        for index, step in enumerate(steps):
            if outcome == "failed":
                results.append(StepResult(tool=step.tool, action_id=None, outcome="not_run",
                                          message="an earlier step failed"))
                continue
            try:
                done = await self._execute(step.tool, step.parameters, bool(dry_run))
            except (ToolNotFound, InvalidArgument, UnitNotAllowed, RateLimited,
                    SandboxUnavailable, UnitBusy, UnitNotFound, UnsafePath, NoPreviousVersion,
                    SystemdUnavailable) as error:
                results.append(StepResult(tool=step.tool, action_id=None, outcome="refused",
                                          message=f"step {index} refused", error=error.name))
                outcome = "failed"
                continue
            results.append(StepResult(tool=step.tool, action_id=done["action_id"],
                                      outcome=done["outcome"], message=done["message"],
                                      job_result=done["job_result"],
                                      active_state=done["active_state"]))
            if not dry_run and done["outcome"] != "succeeded":
                outcome = "failed"
        message = "; ".join(f"{r.tool} {r.outcome}" + (f" ({r.message})" if r.message else "")
                            for r in results)
        return PlanResult(outcome=outcome, steps=results, message=message)

    @implements
    async def GetAudit(self, *, limit: int | None = None,
                       unit: str | None = None) -> list[AuditRecord]:
        if not await self._authorized():
            raise NotAuthorized(action=authz.REMEDIATE)
        if limit is not None and not 0 < limit <= MAX_AUDIT:
            raise InvalidParameter(parameter="limit")
        if unit is not None and len(unit) > units.MAX:
            raise InvalidParameter(parameter="unit")
        rows = await self.audit.rows(limit=limit or 100, unit=unit)
        return [
            AuditRecord(
                id=r.id, timestamp_usec=r.timestamp_usec, uid=r.uid, pid=r.pid, tool=r.tool,
                parameters=r.parameters, dry_run=r.dry_run, decision=r.decision,
                sandbox=r.sandbox, outcome=r.outcome, message=r.message, unit=r.unit,
                error=r.error, rolled_back=r.rolled_back, finished_usec=r.finished_usec,
                details=r.details,
            )
            for r in rows
        ]
