"""revert_dropin: put a unit's drop-in directory back to its previous
version, reload, restart, watch, and roll back if the unit got worse.

Order of execute (each step's failure stops the ones after it):
1. snapshot the directory as it is (content, mode, owner) into the audit DB;
2. write the previous version in a tool process (bubblewrap with only the
   directory writable, Landlock writing only beneath it, seccomp: no
   sockets, no exec), atomically per file, no symlink followed;
3. Manager.Reload; RestartUnit and its job result;
4. watch the unit for the health window: the worst state seen, and any
   restart systemd counts, is its health;
5. worse than before the revert → write the snapshot back the same way,
   reload, restart: outcome rolled_back.
"""

import asyncio
import os
from typing import Any

from syntrop.system.sandbox import SandboxError
from syntrop.system.systemd import SystemdError, UnitState
from syntrop.toold import dropins, errors
from syntrop.toold.context import Context, now_usec
from syntrop.toold.tools.base import UNIT, Outcome, Param, Plan, Tool

POLL = 0.1


class RevertDropin(Tool):
    name = "revert_dropin"
    description = ("Restore the previous version of a unit's drop-in directory (from "
                   "contextd's history, else toold's snapshots), reload, restart, and roll "
                   "back automatically if the unit is worse.")
    risk = "remediation"
    reversible = True
    rollback = ("automatic: the directory is snapshotted first and written back when the "
                "unit's health after the revert is worse than before")
    sandboxed = True
    parameters = (
        UNIT,
        Param(name="scope", type=str, choices=("persistent", "runtime"),
              description="persistent: the first of unit_dirs (/etc/systemd/system); "
                          "runtime: the second (/run/systemd/system). Default persistent."),
        Param(name="health_window_sec", type=int, minimum=0, maximum=300,
              description="How long to watch the unit after the restart (default from "
                          "toold.toml)."),
    )

    def directory(self, args: dict[str, Any], ctx: Context) -> str:
        dirs = ctx.config.unit_dirs
        index = 1 if args.get("scope") == "runtime" else 0
        if index >= len(dirs):
            raise errors.BadArgument("no runtime unit directory is configured",
                                     tool=self.name, parameter="scope",
                                     reason="no runtime unit directory is configured")
        return os.path.join(dirs[index], f"{args['unit']}.d")

    async def prepare(self, args: dict[str, Any], ctx: Context) -> Plan:
        unit = str(args["unit"])
        directory = self.directory(args, ctx)
        try:
            exists, current = await asyncio.to_thread(dropins.read_dir, directory)
            parent_ok, _ = await asyncio.to_thread(_check_parent, os.path.dirname(directory))
        except dropins.UnsafeDirectory as error:
            raise errors.Unsafe(f"{directory} {error}", path=directory, reason=str(error)) \
                from None
        if not parent_ok:
            raise errors.Unsafe(f"{directory}: its parent is not a real directory",
                                path=os.path.dirname(directory), reason="not a real directory")
        ctx.layers()
        state = await ctx.unit_state(unit)
        pending = await ctx.audit.interrupted(directory)
        if pending is not None:
            # A revert toold was stopped in: its own writes are in contextd's
            # history and its snapshot, and neither is "the previous
            # version". Finish what it meant to write.
            interrupted, target = pending
            source = f"the revert toold was stopped in (action {interrupted}), finished"
        else:
            interrupted = None
            found, source = await self._previous(directory, current, ctx)
            if found is None:
                raise errors.NoPrevious(f"{unit}: {source}", unit=unit, reason=source)
            target = found
        change = dropins.changes(current, target)
        window = float(args.get("health_window_sec", ctx.config.health_window))
        writes = dropins.describe(change)
        steps = [
            f"snapshot {directory} ({len(current)} entries) into toold's audit database",
            *([f"create {directory} in a tool process"] if not exists else []),
            *(f"in a tool process confined to {directory}: {line}" for line in writes),
            "call Manager.Reload on PID 1",
            f"call Manager.RestartUnit({unit!r}) and wait for its job",
            f"watch {unit} for {window:g} s (it is {state.active_state} now)",
            f"if it is worse than {state.active_state}: write the snapshot back, reload, "
            "restart",
        ]
        return Plan(steps=steps, unit=unit, sandboxed=True, data={
            "directory": directory, "exists": exists, "current": current, "change": change,
            "source": source, "before": state, "window": window, "writes": writes,
            "target": target, "interrupted": interrupted,
        })

    async def _previous(self, directory: str, current: list[dropins.Entry], ctx: Context
                        ) -> tuple[list[dropins.Entry] | None, str]:
        history = await ctx.history(directory)
        if history:
            target = dropins.undo(current, history)
            if target is not None and target != current:
                return target, "contextd's history"
        for snapshot_id, entries in await ctx.audit.snapshots(directory):
            if entries != current:
                return entries, f"toold's snapshot {snapshot_id}"
        asked = "contextd had no exact history of it" if history is not None \
            else "contextd was not reachable"
        return None, f"{asked}, and no snapshot of toold's differs from the current files"

    async def _write(self, ctx: Context, plan: Plan, change: list[dropins.Entry]
                     ) -> list[str]:
        directory = plan.data["directory"]
        applied: list[str] = []
        if not os.path.isdir(directory):
            parent, name = os.path.split(directory)
            reply, applied = await ctx.tool_process(
                {"action": "mkdir", "parent": parent, "name": name}, [parent])
            if not reply.get("ok"):
                raise SandboxError(f"mkdir {directory}: {reply.get('error')}")
        reply, applied = await ctx.tool_process(
            {"action": "apply", "directory": directory, "entries": change}, [directory])
        if not reply.get("ok"):
            raise SandboxError(f"writing {directory}: {reply.get('error')}")
        return applied

    async def _restart_and_watch(self, ctx: Context, unit: str, window: float
                                 ) -> tuple[str, UnitState, int]:
        systemd = await ctx.systemd()
        await systemd.reload()
        before = await systemd.unit_state(unit)
        job = await systemd.run_job("RestartUnit", unit, timeout=ctx.config.job_timeout)
        state = await systemd.unit_state(unit)
        worst = dropins.health(state.active_state, state.result)
        deadline = asyncio.get_running_loop().time() + window
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(POLL)
            state = await systemd.unit_state(unit)
            worst = min(worst, dropins.health(state.active_state, state.result))
        if state.n_restarts > before.n_restarts and window > 0:
            worst = 0  # systemd restarted it in the window: it failed in between
        return job.result, state, worst

    async def execute(self, plan: Plan, ctx: Context) -> Outcome:
        unit = str(plan.unit)
        before: UnitState = plan.data["before"]
        current = plan.data["current"]
        snapshot = await ctx.audit.snapshot(action_id=ctx.action_id, unit=unit,
                                            directory=plan.data["directory"],
                                            now_usec=now_usec(), entries=current)
        await ctx.audit.intend(action_id=ctx.action_id, directory=plan.data["directory"],
                               target=plan.data["target"])
        if plan.data["interrupted"] is not None:
            await ctx.audit.outcome(plan.data["interrupted"], now_usec=now_usec(), sandbox=[],
                                    outcome="interrupted",
                                    message=f"toold stopped during it; action {ctx.action_id} "
                                            "finishes it")
        details: dict[str, Any] = {"snapshot_id": snapshot, "source": plan.data["source"],
                                   "changed": plan.data["writes"],
                                   "before": before.active_state}
        sandbox: list[str] = []
        try:
            sandbox = await self._write(ctx, plan, plan.data["change"])
            job, after, health = await self._restart_and_watch(ctx, unit, plan.data["window"])
        except (SandboxError, SystemdError, errors.ToolError) as error:
            ctx.drop_systemd()
            message = f"revert failed: {error}"
            changed, restored = await self._restore(ctx, plan, current)
            return Outcome(outcome="failed", message=f"{message}; {restored}",
                           rolled_back=changed, sandbox=sandbox,
                           previous_active_state=before.active_state, details=details)
        details.update(job_after_revert=job, health_before=_health(before),
                       health_after=health, state_after_revert=after.active_state)
        if health < _health(before):
            _, restored = await self._restore(ctx, plan, current)
            try:
                job2, final, _ = await self._restart_and_watch(ctx, unit, 0)
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
        ok = health >= 2
        return Outcome(
            outcome="succeeded" if ok else "failed", sandbox=sandbox, job_result=job,
            active_state=after.active_state, previous_active_state=before.active_state,
            message=f"reverted {plan.data['directory']} from {plan.data['source']}; restart "
                    f"job {job}; {unit} is {after.active_state}"
                    + ("" if ok else " (no worse than before, so the revert is kept)"),
            details=details)

    async def _restore(self, ctx: Context, plan: Plan, snapshot: list[dropins.Entry]
                       ) -> tuple[bool, str]:
        """Write the snapshot back: (whether anything was written, what
        happened in words). Never raises."""
        directory = plan.data["directory"]
        try:
            _, now = await asyncio.to_thread(dropins.read_dir, directory)
            change = dropins.changes(now, snapshot)
            if not change:
                return False, f"{directory} was unchanged"
            await self._write(ctx, plan, change)
        except (SandboxError, OSError, dropins.UnsafeDirectory, errors.ToolError) as error:
            return False, f"restoring the snapshot FAILED: {error}"
        return True, f"restored the snapshot of {directory}"


def _health(state: UnitState) -> int:
    return dropins.health(state.active_state, state.result)


def _check_parent(path: str) -> tuple[bool, None]:
    return os.path.isdir(path) and not os.path.islink(path), None
