"""free_space: make room on the full filesystem a unit writes to, by the two
things that are safe to drop: the unit's own CacheDirectory= contents and
the journal's files beyond the configured size (`[free_space]
journal_keep_mib`). Nothing else is ever deleted.

`path` is the full path the failure named (sentry passes the path statvfs
found full). Only what lives on that path's filesystem is freed: a cache
on another filesystem, or a journal elsewhere, would free nothing that
helps, and a plan with nothing to free on it is refused (InvalidArgument,
reason "nothing to free"), so the caller tries its next plan.

The cache is cleared as clear_cache clears it (a tool process confined to
the directory); the journal is vacuumed by journald's own tool (rotate,
then vacuum to the size), never by deleting its files here. Not
reversible: a cache is re-creatable by definition, and the journal's
oldest archived files are gone (the plan says how much of each).
"""

import asyncio
import os
import stat
from dataclasses import dataclass
from typing import Any

from syntrop.toold import errors
from syntrop.toold.context import Context
from syntrop.toold.tools.base import UNIT, Outcome, Param, Plan, Tool
from syntrop.toold.tools.clear_cache import cache_paths, clear, count

JOURNALCTL = "/usr/bin/journalctl"


def path_error(path: str) -> str | None:
    """Why `path` cannot name a full filesystem, or None: absolute,
    normalized, no '.' or '..' (it is only ever stat'ed)."""
    if not path.startswith("/"):
        return "must be an absolute path"
    if any(part in (".", "..") for part in path.split("/")) or os.path.normpath(path) != path:
        return "must be a normalized path"
    return None


PATH = Param(name="path", type=str, required=True, check=path_error,
             description="A path on the full filesystem (the one the failure named).")


@dataclass(frozen=True, slots=True)
class Usage:
    """What a filesystem has free, and its size, in bytes."""

    free: int
    size: int

    def line(self) -> str:
        return f"{self.free} of {self.size} bytes free"


def device(path: str) -> int:
    """The filesystem of `path`, or of its nearest existing parent."""
    while True:
        try:
            return os.stat(path).st_dev
        except FileNotFoundError:
            if path == "/":
                raise
            path = os.path.dirname(path)


def usage(path: str) -> Usage:
    probe = path
    while probe != "/" and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return Usage(free=st.f_bavail * st.f_frsize, size=st.f_blocks * st.f_frsize)


def journal_bytes(directories: list[str]) -> int:
    """The bytes the journal's files take in `directories` (on disk)."""
    total = 0
    for directory in directories:
        for _, _, names, dfd in os.fwalk(directory, follow_symlinks=False):
            for name in names:
                if name.endswith((".journal", ".journal~")):
                    info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        total += info.st_blocks * 512
    return total


class FreeSpace(Tool):
    name = "free_space"
    description = ("Free the filesystem a path is on: the unit's CacheDirectory= contents and "
                   "the journal beyond its configured size, where they are on it.")
    risk = "maintenance"
    reversible = False
    rollback = ("none: cache contents are re-creatable; the journal's oldest archived files "
                "are gone")
    sandboxed = True
    parameters = (UNIT, PATH)

    async def prepare(self, args: dict[str, Any], ctx: Context) -> Plan:
        unit, path = str(args["unit"]), str(args["path"])
        ctx.layers()
        await ctx.unit_state(unit)
        caches = await cache_paths(unit, ctx) if unit.endswith(".service") else []
        try:
            full = await asyncio.to_thread(device, path)
            before = await asyncio.to_thread(usage, path)
        except OSError as error:
            raise errors.BadArgument(f"{path}: {error.strerror}", tool=self.name,
                                     parameter="path", reason="cannot be stat'ed") from None
        caches = [c for c in caches if await asyncio.to_thread(device, c) == full]
        counts = [await asyncio.to_thread(count, c) for c in caches]
        journals = [str(d) for d in ctx.config.journal_dirs
                    if os.path.isdir(d) and await asyncio.to_thread(device, str(d)) == full]
        held = await asyncio.to_thread(journal_bytes, journals)
        keep = ctx.config.journal_keep
        steps = [f"in a tool process confined to {c}: remove {files} files ({size} bytes) "
                 f"beneath it" for c, (files, size) in zip(caches, counts, strict=True)
                 if files]
        if held > keep:
            steps.append(f"rotate the journal and vacuum it from {held} to at most {keep} "
                         f"bytes ({', '.join(journals)})")
        if not steps:
            raise errors.BadArgument(
                f"nothing to free on {path}'s filesystem ({before.line()}): the unit's cache "
                f"is empty or elsewhere and the journal is within {keep} bytes or elsewhere",
                tool=self.name, parameter="path", reason="nothing to free")
        return Plan(steps=steps, unit=unit, sandboxed=bool(caches),
                    data={"path": path, "caches": [c for c, (files, _) in
                                                   zip(caches, counts, strict=True) if files],
                          "vacuum": held > keep, "journal_bytes": held})

    async def execute(self, plan: Plan, ctx: Context) -> Outcome:
        path = plan.data["path"]
        outcome = Outcome(outcome="succeeded", message="")
        if plan.data["caches"]:
            outcome = await clear(plan.data["caches"], ctx)
            if outcome.outcome != "succeeded":
                return outcome
        words = [outcome.message] if outcome.message else []
        if plan.data["vacuum"]:
            failed = await vacuum(ctx.config.journal_keep, ctx.config.sandbox_timeout)
            if failed:
                return Outcome(outcome="failed", sandbox=outcome.sandbox,
                               message="; ".join([*words, f"the journal: {failed}"]))
            words.append(f"vacuumed the journal to at most {ctx.config.journal_keep} bytes")
        after = await asyncio.to_thread(usage, path)
        return Outcome(outcome="succeeded", sandbox=outcome.sandbox,
                       message="; ".join([*words, f"{path}: {after.line()}"]),
                       details={**outcome.details, "free_bytes": after.free,
                                "journal_bytes_before": plan.data["journal_bytes"]})


async def vacuum(keep: int, timeout: float) -> str | None:
    """Rotate the journal and vacuum it to `keep` bytes; why it failed, or
    None."""
    try:
        process = await asyncio.create_subprocess_exec(
            JOURNALCTL, "--rotate", f"--vacuum-size={keep}",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
    except OSError as error:
        return f"{JOURNALCTL}: {error.strerror}"
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        return f"{JOURNALCTL} took longer than {timeout:g} s"
    if process.returncode:
        said = stderr.decode(errors="replace").strip()[-200:]
        return f"{JOURNALCTL} exited with status {process.returncode}: {said}"
    return None
