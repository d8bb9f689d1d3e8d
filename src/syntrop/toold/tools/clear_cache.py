"""clear_cache: remove the contents of a unit's CacheDirectory= and nothing
else, in a tool process whose only writable path (bubblewrap bind and
Landlock rule) is that directory."""

import asyncio
import os
import stat
from typing import Any

from syntrop.system.sandbox import SandboxError
from syntrop.system.systemd import SERVICE, SystemdError
from syntrop.toold import errors
from syntrop.toold.context import Context
from syntrop.toold.tools.base import UNIT, Outcome, Plan, Tool

#: Entries counted for a plan before giving up counting.
COUNT_LIMIT = 100_000


class ClearCache(Tool):
    name = "clear_cache"
    description = ("Remove everything inside a service's CacheDirectory= (the directories "
                   "stay).")
    risk = "maintenance"
    reversible = False
    rollback = "none: cache contents are by definition re-creatable"
    sandboxed = True
    parameters = (UNIT,)

    async def prepare(self, args: dict[str, Any], ctx: Context) -> Plan:
        unit = str(args["unit"])
        if not unit.endswith(".service"):
            raise errors.BadArgument("only services have a CacheDirectory=", tool=self.name,
                                     parameter="unit", reason="not a .service")
        ctx.layers()
        await ctx.unit_state(unit)
        paths = await cache_paths(unit, ctx)
        if not paths:
            raise errors.BadArgument(f"{unit} has no CacheDirectory=", tool=self.name,
                                     parameter="unit", reason="the unit has no CacheDirectory=")
        counts = [await asyncio.to_thread(count, path) for path in paths]
        steps = [f"in a tool process confined to {path}: remove {files} files "
                 f"({size} bytes) beneath it" for path, (files, size) in zip(paths, counts,
                                                                            strict=True)]
        return Plan(steps=steps, unit=unit, sandboxed=True, data={"paths": paths})

    async def execute(self, plan: Plan, ctx: Context) -> Outcome:
        return await clear(plan.data["paths"], ctx)


async def cache_paths(unit: str, ctx: Context) -> list[str]:
    """The directories of a service's CacheDirectory= (none: an empty list)."""
    try:
        names = await (await ctx.systemd()).unit_property(unit, SERVICE, "CacheDirectory")
    except SystemdError as error:
        ctx.drop_systemd()
        raise errors.NoSystemd(str(error), reason=str(error)) from None
    return [resolve(str(name), ctx) for name in names or ()]


def resolve(name: str, ctx: Context) -> str:
    """cache_root/name, or cache_root/private/name for a DynamicUser=
    unit (systemd's symlink, exactly); anything else is unsafe."""
    if name.startswith("/") or ".." in name.split("/") or not name:
        raise errors.Unsafe(f"CacheDirectory={name}", path=name, reason="not a plain name")
    path = os.path.join(ctx.config.cache_root, name)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise errors.Unsafe(f"{path} does not exist", path=path,
                            reason="does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        if os.readlink(path) != os.path.join("private", name):
            raise errors.Unsafe(f"{path} is a symlink", path=path, reason="is a symlink")
        path = os.path.join(ctx.config.cache_root, "private", name)
        info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise errors.Unsafe(f"{path} is not a directory", path=path,
                            reason="not a directory")
    return path


async def clear(paths: list[str], ctx: Context) -> Outcome:
    """Empty each of `paths` in a tool process confined to it."""
    removed_files = removed_bytes = 0
    sandbox: list[str] = []
    for path in paths:
        try:
            reply, sandbox = await ctx.tool_process({"action": "clear", "directory": path},
                                                    [path])
        except (SandboxError, errors.ToolError) as error:
            return Outcome(outcome="failed", message=f"clearing {path}: {error}",
                           sandbox=sandbox)
        if not reply.get("ok"):
            return Outcome(outcome="failed", sandbox=sandbox,
                           message=f"clearing {path}: {reply.get('error')}")
        removed_files += int(reply.get("removed_files", 0))
        removed_bytes += int(reply.get("removed_bytes", 0))
    return Outcome(outcome="succeeded", sandbox=sandbox,
                   message=f"removed {removed_files} files ({removed_bytes} bytes)",
                   details={"paths": paths, "removed_files": removed_files,
                            "removed_bytes": removed_bytes})


def count(path: str) -> tuple[int, int]:
    files = size = 0
    for _, _, names, dfd in os.fwalk(path, follow_symlinks=False):
        for name in names:
            files += 1
            size += os.stat(name, dir_fd=dfd, follow_symlinks=False).st_size
            if files >= COUNT_LIMIT:
                return files, size
    return files, size
