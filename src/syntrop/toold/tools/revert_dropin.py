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
from syntrop.system.systemd import UnitState
from syntrop.toold import dropins, errors, watched
from syntrop.toold.context import Context, now_usec
from syntrop.toold.tools.base import UNIT, Outcome, Param, Plan, Tool


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
        return await watched.apply(watched.Revert(
            unit=unit, before=before, window=plan.data["window"], reload=True,
            what=f"reverted {plan.data['directory']} from {plan.data['source']}",
            write=lambda: self._write(ctx, plan, plan.data["change"]),
            restore=lambda: self._restore(ctx, plan, current)), ctx, details)

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


def _check_parent(path: str) -> tuple[bool, None]:
    return os.path.isdir(path) and not os.path.islink(path), None
