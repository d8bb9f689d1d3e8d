"""revert_config: put one config file under /etc back to its content before
the latest change contextd recorded, restart the unit, watch, and roll back
if the unit got worse.

The previous content is contextd's diff of the newest burst of events on
the file applied in reverse to the current content (dropins.undo); an event
that cannot be undone exactly (no diff, a cut diff, a mode change, a
creation, text that no longer matches) refuses the path. Mode and owner are
kept: the tool process can give back only root's ownership, so a file owned
by another user or group is refused.

Order of execute (each step's failure stops the ones after it):
1. snapshot the file as it is (content, mode, owner) into the audit DB;
2. write the previous content in a tool process (bubblewrap with only the
   file's directory writable, Landlock writing only beneath it, seccomp: no
   sockets, no exec), atomically, no symlink followed;
3. Manager.Reload when the file is one of systemd's (under a unit
   directory); RestartUnit and its job result;
4. watch the unit for the health window: the worst state seen, and any
   restart systemd counts, is its health;
5. worse than before the revert → write the snapshot back the same way and
   restart: outcome rolled_back.
"""

import asyncio
import base64
import difflib
import errno
import os
import posixpath
import stat
from typing import Any

from syntrop.system.sandbox import SandboxError
from syntrop.system.systemd import UnitState
from syntrop.toold import dropins, errors, watched
from syntrop.toold.context import Context, now_usec
from syntrop.toold.helper import Refused, open_dir
from syntrop.toold.tools.base import UNIT, Outcome, Param, Plan, Tool

ROOT = "/etc/"
#: The most of the diff a plan shows.
MAX_SHOWN_DIFF = 8192


class BadPath(Exception):
    """The path is not a root-owned regular file under /etc (the reason)."""


def path_error(path: str) -> str | None:
    """Why `path` is not acceptable as written, or None: absolute, under
    /etc, normalized (no '..', '.', '//', trailing '/')."""
    if not path.startswith("/"):
        return "must be an absolute path"
    if any(part in (".", "..") for part in path.split("/")):
        return "must not contain '.' or '..'"
    if posixpath.normpath(path) != path:
        return "must be a normalized path"
    if not path.startswith(ROOT) or path == ROOT.rstrip("/"):
        return "must be a file under /etc"
    return None


def read_file(path: str) -> dropins.Entry:
    """The file as a drop-in entry (named by its base name). Reached with no
    symlink followed at any component; raises BadPath."""
    directory, name = posixpath.split(path)
    try:
        dfd = open_dir(directory)
    except Refused as error:
        raise BadPath(str(error)) from None
    except FileNotFoundError:
        raise BadPath(f"{directory} does not exist") from None
    try:
        try:
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise BadPath("does not exist") from None
        if stat.S_ISLNK(info.st_mode):
            raise BadPath("is a symlink")
        if not stat.S_ISREG(info.st_mode):
            raise BadPath("is not a regular file")
        if info.st_size > dropins.MAX_FILE_BYTES:
            raise BadPath(f"is larger than {dropins.MAX_FILE_BYTES} bytes")
        if (info.st_uid, info.st_gid) != (0, 0):
            raise BadPath(f"is owned by {info.st_uid}:{info.st_gid}; only a file owned by "
                          "root (0:0) can be written back with its owner")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise BadPath("changed into a symlink while being read") from None
            raise
        try:
            content = os.read(fd, dropins.MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return {"name": name, "state": "file", "content": base64.b64encode(content).decode(),
            "mode": stat.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid}


def previous(current: dropins.Entry, history: list[dropins.Change]) -> dropins.Entry | None:
    """The file before the newest burst of `history`, or None when that is
    not exactly known (or is no file: the newest change created it)."""
    undone = dropins.undo([current], history)
    if undone is None or len(undone) != 1 or undone[0] == current:
        return None
    return undone[0]


def diff(path: str, current: dropins.Entry, target: dropins.Entry) -> str:
    """What writing `target` over `current` changes, as a unified diff."""
    before = (dropins.text_of(current) or "").splitlines(keepends=True)
    after = (dropins.text_of(target) or "").splitlines(keepends=True)
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in difflib.unified_diff(before, after, fromfile=f"a{path}",
                                                    tofile=f"b{path}"))
    if len(text) > MAX_SHOWN_DIFF:
        text = text[:MAX_SHOWN_DIFF] + f"… cut at {MAX_SHOWN_DIFF} characters\n"
    return text


class RevertConfig(Tool):
    name = "revert_config"
    description = ("Put a config file under /etc back to its content before the latest "
                   "change contextd recorded (its diff reversed), restart the unit, and roll "
                   "back automatically if the unit is worse.")
    risk = "remediation"
    reversible = True
    rollback = ("automatic: the file is snapshotted first and written back when the unit's "
                "health after the revert is worse than before")
    sandboxed = True
    parameters = (
        UNIT,
        Param(name="path", type=str, required=True, check=path_error,
              description="The file to put back: an absolute path of a regular file under "
                          "/etc, owned by root, with no symlink in it, whose latest change "
                          "contextd recorded with an exact diff."),
        Param(name="health_window_sec", type=int, minimum=0, maximum=300,
              description="How long to watch the unit after the restart (default from "
                          "toold.toml)."),
    )

    async def prepare(self, args: dict[str, Any], ctx: Context) -> Plan:
        unit, path = str(args["unit"]), str(args["path"])
        try:
            current = await asyncio.to_thread(read_file, path)
        except BadPath as error:
            raise self._bad("path", f"{path} {error}") from None
        ctx.layers()
        state = await ctx.unit_state(unit)
        pending = await ctx.audit.interrupted(path)
        if pending is not None:
            # A revert toold was stopped in: its own write is now contextd's
            # latest change. Finish what it meant to write.
            interrupted: int | None = pending[0]
            target: dropins.Entry = pending[1][0]
            source = f"the revert toold was stopped in (action {interrupted}), finished"
        else:
            interrupted = None
            history = await ctx.file_history(path)
            if history is None:
                raise errors.NoPrevious(f"{unit}: contextd was not reachable", unit=unit,
                                        reason=f"contextd was not reachable for {path}")
            found = previous(current, history)
            if found is None:
                why = "has no exact diff of its latest change" if history \
                    else "recorded no change of it"
                raise self._bad("path", f"{path}: contextd {why}")
            target, source = found, "contextd's history"
        directory = posixpath.dirname(path)
        window = float(args.get("health_window_sec", ctx.config.health_window))
        shown = diff(path, current, target)
        reload = any(directory == str(d) or directory.startswith(f"{d}/")
                     for d in ctx.config.unit_dirs)
        steps = [
            f"snapshot {path} into toold's audit database",
            f"in a tool process confined to {directory}: write {path} "
            f"(mode {current['mode']:04o}, owner 0:0) back to its content before the "
            f"latest change:\n{shown}",
            *(["call Manager.Reload on PID 1"] if reload else []),
            f"call Manager.RestartUnit({unit!r}) and wait for its job",
            f"watch {unit} for {window:g} s (it is {state.active_state} now)",
            f"if it is worse than {state.active_state}: write the snapshot back, restart",
        ]
        return Plan(steps=steps, unit=unit, sandboxed=True, data={
            "path": path, "directory": directory, "current": current, "target": target,
            "source": source, "before": state, "window": window, "diff": shown,
            "reload": reload, "interrupted": interrupted,
        })

    async def _write(self, ctx: Context, plan: Plan, entry: dropins.Entry) -> list[str]:
        directory = plan.data["directory"]
        reply, applied = await ctx.tool_process(
            {"action": "apply", "directory": directory, "entries": [entry]}, [directory])
        if not reply.get("ok"):
            raise SandboxError(f"writing {plan.data['path']}: {reply.get('error')}")
        if reply.get("warnings"):
            raise SandboxError(f"writing {plan.data['path']}: {reply['warnings']}")
        return applied

    async def execute(self, plan: Plan, ctx: Context) -> Outcome:
        unit, path = str(plan.unit), plan.data["path"]
        before: UnitState = plan.data["before"]
        current = plan.data["current"]
        snapshot = await ctx.audit.snapshot(action_id=ctx.action_id, unit=unit, directory=path,
                                            now_usec=now_usec(), entries=[current])
        await ctx.audit.intend(action_id=ctx.action_id, directory=path,
                               target=[plan.data["target"]])
        if plan.data["interrupted"] is not None:
            await ctx.audit.outcome(plan.data["interrupted"], now_usec=now_usec(), sandbox=[],
                                    outcome="interrupted",
                                    message=f"toold stopped during it; action {ctx.action_id} "
                                            "finishes it")
        details: dict[str, Any] = {"snapshot_id": snapshot, "source": plan.data["source"],
                                   "path": path, "diff": plan.data["diff"],
                                   "before": before.active_state}
        return await watched.apply(watched.Revert(
            unit=unit, before=before, window=plan.data["window"], reload=plan.data["reload"],
            what=f"reverted {path} from {plan.data['source']}",
            write=lambda: self._write(ctx, plan, plan.data["target"]),
            restore=lambda: self._restore(ctx, plan)), ctx, details)

    async def _restore(self, ctx: Context, plan: Plan) -> tuple[bool, str]:
        """Write the snapshot back: (whether anything was written, what
        happened in words). Never raises."""
        path, snapshot = plan.data["path"], plan.data["current"]
        try:
            now = await asyncio.to_thread(read_file, path)
            if now == snapshot:
                return False, f"{path} was unchanged"
            await self._write(ctx, plan, snapshot)
        except (SandboxError, OSError, BadPath, errors.ToolError) as error:
            return False, f"restoring the snapshot FAILED: {error}"
        return True, f"restored the snapshot of {path}"

