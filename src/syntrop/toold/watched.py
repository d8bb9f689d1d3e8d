"""A reverting tool's execute, once: write the earlier version, restart
the unit and watch it for the health window, and put the snapshot back
(then restart again) when the unit is worse than before. revert_dropin
(a drop-in directory) and revert_config (one file under /etc) differ only
in what they write and put back, which they hand in as callables."""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from syntrop.system.sandbox import SandboxError
from syntrop.system.systemd import SystemdError, UnitState
from syntrop.toold import dropins, errors
from syntrop.toold.context import Context
from syntrop.toold.tools.base import Outcome

#: Seconds between looks at the unit during the health window.
POLL = 0.1


def health(state: UnitState) -> int:
    return dropins.health(state.active_state, state.result)


async def restart_and_watch(ctx: Context, unit: str, window: float, *, reload: bool
                            ) -> tuple[str, UnitState, int]:
    """Reload systemd (when the written files are its own), restart `unit`
    and watch it for `window` seconds: the restart job's result, the state
    at the end, and the worst health seen (0 when systemd restarted it in
    the window: it failed in between)."""
    systemd = await ctx.systemd()
    if reload:
        await systemd.reload()
    before = await systemd.unit_state(unit)
    job = await systemd.run_job("RestartUnit", unit, timeout=ctx.config.job_timeout)
    state = await systemd.unit_state(unit)
    worst = health(state)
    deadline = asyncio.get_running_loop().time() + window
    while asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(POLL)
        state = await systemd.unit_state(unit)
        worst = min(worst, health(state))
    if state.n_restarts > before.n_restarts and window > 0:
        worst = 0
    return job.result, state, worst


@dataclass(frozen=True, slots=True, kw_only=True)
class Revert:
    """What a reverting tool hands `apply`: the unit and its state before,
    the health window, whether systemd must reload, what was reverted (in
    words, for the message), how to write the earlier version (returns the
    sandbox layers applied) and how to put the snapshot back (whether
    anything was written, and what happened, in words; never raises)."""

    unit: str
    before: UnitState
    window: float
    reload: bool
    what: str
    write: Callable[[], Awaitable[list[str]]]
    restore: Callable[[], Awaitable[tuple[bool, str]]]


async def apply(revert: Revert, ctx: Context, details: dict[str, Any]) -> Outcome:
    """Write, restart, watch; roll back when the unit is worse (see the
    module)."""
    unit, before = revert.unit, revert.before
    sandbox: list[str] = []
    try:
        sandbox = await revert.write()
        job, after, worst = await restart_and_watch(ctx, unit, revert.window,
                                                    reload=revert.reload)
    except (SandboxError, SystemdError, errors.ToolError) as error:
        ctx.drop_systemd()
        changed, restored = await revert.restore()
        return Outcome(outcome="failed", message=f"revert failed: {error}; {restored}",
                       rolled_back=changed, sandbox=sandbox,
                       previous_active_state=before.active_state, details=details)
    details.update(job_after_revert=job, health_before=health(before), health_after=worst,
                   state_after_revert=after.active_state)
    if worst < health(before):
        _, restored = await revert.restore()
        try:
            job2, final, _ = await restart_and_watch(ctx, unit, 0, reload=revert.reload)
        except (SystemdError, errors.ToolError) as error:
            ctx.drop_systemd()
            return Outcome(outcome="failed", rolled_back=True, sandbox=sandbox,
                           message=f"{unit} was worse ({after.active_state}); {restored}; "
                                   f"restarting after the rollback failed: {error}",
                           job_result=job, previous_active_state=before.active_state,
                           details=details)
        details.update(job_after_rollback=job2)
        return Outcome(
            outcome="rolled_back", rolled_back=True, sandbox=sandbox, job_result=job2,
            active_state=final.active_state, previous_active_state=before.active_state,
            message=f"{unit} was worse after the revert ({after.active_state}, was "
                    f"{before.active_state}); {restored}; it is {final.active_state} now",
            details=details)
    ok = worst >= 2
    return Outcome(
        outcome="succeeded" if ok else "failed", sandbox=sandbox, job_result=job,
        active_state=after.active_state, previous_active_state=before.active_state,
        message=f"{revert.what}; restart job {job}; {unit} is {after.active_state}"
                + ("" if ok else " (no worse than before, so the revert is kept)"),
        details=details)
