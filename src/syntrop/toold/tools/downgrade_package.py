"""downgrade_package: put a Debian package back to the version before the
installed one, from the local package cache, restart the unit that runs
its program, watch it, and put the newer version back if the unit got
worse.

prepare (all a dry run does), reading only:
1. the installed version and architecture, from dpkg's status file
   (`[downgrade_package] status`; the package's stanza must say
   "install ok installed"); not installed is InvalidArgument;
2. the previous version: the highest version lower than the installed one
   among `PACKAGE_VERSION_ARCH.deb` files in the cache
   (`[downgrade_package] archives`; an epoch is written `%3a` there, as the
   package tools write it), of the installed architecture or `all`,
   compared by Debian's version ordering (`compare`: epoch, upstream
   version, revision, `~` before everything); none is NoPreviousVersion
   with reason "no previous version in the package cache";
3. that file's own control fields (`dpkg-deb -f FILE Package Version`,
   fixed argv, no shell) must be the package and version its name says,
   else InvalidArgument: a file named for one version that holds another
   is never installed.

execute: dpkg cannot run in toold's own sandbox (ProtectSystem=strict keeps
/usr and /var/lib/dpkg read-only there), so PID 1 runs it, as a transient
oneshot service (`syntrop-downgrade-PACKAGE-RANDOM.service`, Manager.
StartTransientUnit) with `dpkg --install FILE` and its job's result
awaited; then the unit is restarted and watched for the health window
(watched.py, shared with the reverting tools). A unit worse than before
gets the installed version back the same way, from its own .deb in the
cache (outcome rolled_back); where that .deb is not there, nothing can
put it back: outcome failed, saying so. The tool is reversible only where
both .debs are in the cache; the plan says which.
"""

import asyncio
import os
import re
import secrets
from dataclasses import dataclass
from typing import Any

from syntrop.system.debian import compare, version_error
from syntrop.system.systemd import SystemdError, UnitState
from syntrop.toold import errors, watched
from syntrop.toold.context import Context
from syntrop.toold.tools.base import UNIT, Outcome, Param, Plan, Tool

DPKG = "/usr/bin/dpkg"
DPKG_DEB = "/usr/bin/dpkg-deb"
#: A Debian package name (no architecture qualifier).
PACKAGE_PATTERN = r"[a-z0-9][a-z0-9+.-]+"
#: How long reading a .deb's control fields may take, in seconds.
FIELDS_TIMEOUT = 30.0
#: The most bytes of the status file read (it is text, one stanza a package).
MAX_STATUS_BYTES = 64 << 20

PACKAGE = Param(name="package", type=str, required=True, pattern=PACKAGE_PATTERN,
                description="The Debian package to put back to its previous version "
                            "(its name, without an architecture).")


# What is installed, and what the cache holds ------------------------------------

@dataclass(frozen=True, slots=True)
class Installed:
    version: str
    architecture: str


def installed(status: str, package: str) -> Installed | None:
    """The package's installed version and architecture from dpkg's status
    file text, or None when it is not installed ("install ok installed")."""
    for stanza in re.split(r"\n\s*\n", status):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("package") != package:
            continue
        if fields.get("status") == "install ok installed" and fields.get("version"):
            return Installed(version=fields["version"],
                             architecture=fields.get("architecture", "all"))
    return None


def read_status(path: str, package: str) -> Installed | None:
    with open(path, encoding="utf-8", errors="replace") as file:
        return installed(file.read(MAX_STATUS_BYTES), package)


@dataclass(frozen=True, slots=True)
class Deb:
    path: str
    version: str
    architecture: str


def cached(directory: str, package: str, architecture: str) -> list[Deb]:
    """The package's .debs in the cache, of `architecture` or all: regular
    files named PACKAGE_VERSION_ARCH.deb (an epoch's ':' written %3a) with
    a valid version."""
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        if not name.startswith(f"{package}_") or not name.endswith(".deb"):
            continue
        rest = name[len(package) + 1:-len(".deb")]
        version, _, arch = rest.rpartition("_")
        version = version.replace("%3a", ":").replace("%3A", ":")
        if not version or "_" in version or arch not in (architecture, "all") \
                or version_error(version):
            continue
        path = os.path.join(directory, name)
        if os.path.isfile(path) and not os.path.islink(path):
            found.append(Deb(path=path, version=version, architecture=arch))
    return found


def previous(debs: list[Deb], current: str) -> Deb | None:
    """The highest version lower than `current` among `debs`."""
    older = [d for d in debs if compare(d.version, current) < 0]
    best: Deb | None = None
    for deb in older:
        if best is None or compare(deb.version, best.version) > 0:
            best = deb
    return best


def same(debs: list[Deb], current: str) -> Deb | None:
    """The .deb of `current` itself (to put it back), or None."""
    return next((d for d in debs if compare(d.version, current) == 0), None)


async def deb_fields(path: str) -> dict[str, str]:
    """The .deb's Package and Version control fields (dpkg-deb, fixed argv);
    raises OSError, TimeoutError or ValueError."""
    process = await asyncio.create_subprocess_exec(
        DPKG_DEB, "-f", path, "Package", "Version", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), FIELDS_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    if process.returncode:
        said = stderr.decode(errors="replace").strip()[-200:]
        raise ValueError(f"{DPKG_DEB} exited with status {process.returncode}: {said}")
    fields = {}
    for line in stdout.decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def transient_name(package: str) -> str:
    """The transient unit dpkg runs in: syntrop-downgrade-PACKAGE-RANDOM."""
    safe = re.sub(r"[^A-Za-z0-9.-]", "_", package)
    return f"syntrop-downgrade-{safe}-{secrets.token_hex(4)}.service"


class DowngradePackage(Tool):
    name = "downgrade_package"
    description = ("Install the previous version of a Debian package from the local package "
                   "cache (by dpkg, in a transient unit PID 1 runs), restart the unit, and put "
                   "the newer version back if the unit is worse.")
    risk = "remediation"
    reversible = True
    rollback = ("automatic where the installed version's .deb is in the package cache too "
                "(the plan says whether it is): installed again when the unit's health after "
                "the downgrade is worse than before; without it, nothing can put it back")
    sandboxed = False
    parameters = (
        UNIT, PACKAGE,
        Param(name="health_window_sec", type=int, minimum=0, maximum=300,
              description="How long to watch the unit after the restart (default from "
                          "toold.toml)."),
    )

    async def prepare(self, args: dict[str, Any], ctx: Context) -> Plan:
        unit, package = str(args["unit"]), str(args["package"])
        state = await ctx.unit_state(unit)
        status, archives = str(ctx.config.dpkg_status), str(ctx.config.archives)
        try:
            now = await asyncio.to_thread(read_status, status, package)
        except OSError as error:
            raise errors.BadArgument(f"{status}: {error.strerror}", tool=self.name,
                                     parameter="package",
                                     reason="dpkg's status cannot be read") from None
        if now is None:
            raise errors.BadArgument(f"{package} is not installed", tool=self.name,
                                     parameter="package", reason="not installed")
        try:
            debs = await asyncio.to_thread(cached, archives, package, now.architecture)
            older, newer = previous(debs, now.version), same(debs, now.version)
        except (OSError, ValueError) as error:
            raise errors.BadArgument(f"{archives}: {error}", tool=self.name,
                                     parameter="package",
                                     reason="the package cache cannot be read") from None
        if older is None:
            raise errors.NoPrevious(
                f"{package} {now.version}: no previous version in the package cache "
                f"({archives})", unit=unit, reason="no previous version in the package cache")
        try:
            fields = await deb_fields(older.path)
        except (OSError, TimeoutError, ValueError) as error:
            raise errors.BadArgument(f"{older.path}: {error}", tool=self.name,
                                     parameter="package",
                                     reason="the .deb's control fields cannot be read") from None
        if (fields.get("Package"), fields.get("Version")) != (package, older.version):
            raise errors.BadArgument(
                f"{older.path} holds {fields.get('Package')} {fields.get('Version')}, not "
                f"{package} {older.version}", tool=self.name, parameter="package",
                reason="the .deb's control fields do not match its name")
        window = float(args.get("health_window_sec", ctx.config.health_window))
        steps = [
            f"install {package} {older.version} from {older.path} (replacing "
            f"{now.version}): {DPKG} --install in a transient unit PID 1 runs",
            f"call Manager.RestartUnit({unit!r}) and wait for its job",
            f"watch {unit} for {window:g} s (it is {state.active_state} now)",
            f"if it is worse than {state.active_state}: "
            + (f"install {now.version} again from {newer.path}, restart" if newer else
               f"nothing can put {now.version} back: its .deb is not in {archives}"),
        ]
        return Plan(steps=steps, unit=unit, data={
            "package": package, "installed": now.version, "older": older, "newer": newer,
            "before": state, "window": window, "reversible": newer is not None})

    async def execute(self, plan: Plan, ctx: Context) -> Outcome:
        unit, package = str(plan.unit), plan.data["package"]
        older: Deb = plan.data["older"]
        newer: Deb | None = plan.data["newer"]
        before: UnitState = plan.data["before"]
        put_back: list[bool] = []

        async def write() -> list[str]:
            await install(ctx, package, older.path)
            return []

        async def restore() -> tuple[bool, str]:
            if newer is None:
                put_back.append(False)
                return False, (f"{package} {plan.data['installed']} cannot be put back: its "
                               f".deb is not in {ctx.config.archives}")
            try:
                await install(ctx, package, newer.path)
            except (SystemdError, errors.ToolError) as error:
                put_back.append(False)
                return False, f"installing {newer.version} again FAILED: {error}"
            put_back.append(True)
            return True, f"installed {package} {newer.version} again from {newer.path}"

        details: dict[str, Any] = {"package": package, "from_version": plan.data["installed"],
                                   "to_version": older.version, "deb": older.path,
                                   "newer_deb": newer.path if newer else None,
                                   "before": before.active_state}
        outcome = await watched.apply(watched.Revert(
            unit=unit, before=before, window=plan.data["window"], reload=False,
            what=f"installed {package} {older.version} (was {plan.data['installed']})",
            write=write, restore=restore), ctx, details)
        if outcome.outcome == "rolled_back" and put_back and not put_back[-1]:
            outcome.outcome, outcome.rolled_back = "failed", False
        return outcome


async def install(ctx: Context, package: str, path: str) -> None:
    """`dpkg --install PATH` in a transient oneshot unit PID 1 runs; raises
    ToolError when its job did not end done."""
    systemd = await ctx.systemd()
    name = transient_name(package)
    job = await systemd.start_transient(
        name, [DPKG, "--force-confdef", "--force-confold", "--install", path],
        description=f"syntrop toold: install {os.path.basename(path)}",
        timeout=ctx.config.job_timeout)
    if job.result != "done":
        raise errors.ToolError(f"{name}: {DPKG} --install {path}: job {job.result} (its "
                               f"journal says why)", reason=f"dpkg's job {job.result}")
