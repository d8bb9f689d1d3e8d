"""toold.toml, validated into a record. Every host path toold touches is here.

    unit_dirs = ["/etc/systemd/system", "/run/systemd/system"]
                                    # where drop-ins live: persistent, runtime
    cache_root = "/var/cache"       # where a unit's CacheDirectory= lives
    allow = ["*.service"]           # unit name patterns (fnmatch) toold may act on
    deny = [...]                    # never these (default: PID 1's critical units
                                    # and syntrop's own); replaces the default
    sentry_uid = 0                  # or sentry_user = "syntrop-sentry": may Execute
    dbus_address = "unix:path=/run/dbus/system_bus_socket"  # default: the system bus
    context_socket = "/run/syntrop/io.syntrop.Context1"     # contextd, for history

    [rate]                          # actions (not dry runs) per sliding window
    per_unit = 3
    per_unit_window_sec = 60
    global = 20
    global_window_sec = 60

    [sandbox]
    bwrap = "/usr/bin/bwrap"
    python = "/opt/syntrop/bin/python"  # the tool process's interpreter (default: toold's)
    allow_weaker = false            # run with the layers available instead of refusing
    timeout_sec = 30

    [free_space]                    # what free_space may free, besides a unit's cache
    journal_dirs = ["/var/log/journal", "/run/log/journal"]
    journal_keep_mib = 64           # the journal is vacuumed to this size

    [downgrade_package]             # where downgrade_package finds versions
    archives = "/var/cache/apt/archives"  # the local package cache (.debs)
    status = "/var/lib/dpkg/status"       # dpkg's record of what is installed

    [timeouts]
    job_sec = 60                    # wait this long for a job's JobRemoved
    health_window_sec = 3           # watch a unit this long after a revert
"""

import pwd
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syntrop.config import ConfigError, integer, load_toml, number

#: Units toold never acts on unless `deny` is configured otherwise: PID 1's
#: own critical units, the bus, the journal, login, udev, and syntrop itself.
DEFAULT_DENY = (
    "init.scope", "-.mount", "-.slice", "*.slice", "*.scope",
    "dbus.service", "dbus.socket", "dbus-broker.service",
    "systemd-journald*", "systemd-logind.service", "systemd-udevd*",
    "systemd-networkd*", "systemd-resolved.service", "systemd-timesyncd.service",
    "getty@*", "serial-getty@*", "console-getty.service", "sshd.service", "ssh.service",
    "toold.*", "inferenced.*", "modeld.*", "contextd.*", "runtimed.*",
    "sentry.*", "systemd-sentry.*", "routerd.*", "syntrop-*",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    per_unit: int = 3
    per_unit_window: float = 60.0
    total: int = 20
    total_window: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    unit_dirs: tuple[Path, ...] = (Path("/etc/systemd/system"), Path("/run/systemd/system"))
    cache_root: Path = Path("/var/cache")
    allow: tuple[str, ...] = ("*.service",)
    deny: tuple[str, ...] = DEFAULT_DENY
    sentry_uid: int | None = None
    dbus_address: str | None = None
    context_socket: Path | None = None
    rate: RateLimit = field(default_factory=RateLimit)
    bwrap: str = "/usr/bin/bwrap"
    python: str | None = None
    allow_weaker: bool = False
    sandbox_timeout: float = 30.0
    job_timeout: float = 60.0
    health_window: float = 3.0
    journal_dirs: tuple[Path, ...] = (Path("/var/log/journal"), Path("/run/log/journal"))
    journal_keep: int = 64 << 20
    archives: Path = Path("/var/cache/apt/archives")
    dpkg_status: Path = Path("/var/lib/dpkg/status")


def _patterns(data: dict[str, Any], key: str, default: tuple[str, ...], where: str
              ) -> tuple[str, ...]:
    value = data.get(key, list(default))
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {key} must be a list of unit name patterns")
    return tuple(value)


def _path(value: object, key: str, where: str) -> Path:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigError(f"{where}: {key} must be an absolute path")
    return Path(value)


def parse(data: dict[str, Any], where: str = "toold.toml") -> Config:
    dirs = data.get("unit_dirs", ["/etc/systemd/system", "/run/systemd/system"])
    if not isinstance(dirs, list) or not dirs:
        raise ConfigError(f"{where}: unit_dirs must be a non-empty list of paths")
    sentry_uid = data.get("sentry_uid")
    if "sentry_user" in data:
        try:
            sentry_uid = pwd.getpwnam(str(data["sentry_user"])).pw_uid
        except KeyError:
            sentry_uid = None  # the user does not exist (yet): nobody but root
    if sentry_uid is not None and (isinstance(sentry_uid, bool) or not isinstance(sentry_uid, int)
                                   or sentry_uid < 0):
        raise ConfigError(f"{where}: sentry_uid must be a uid")
    rate = data.get("rate", {})
    sandbox = data.get("sandbox", {})
    timeouts = data.get("timeouts", {})
    free = data.get("free_space", {})
    downgrade = data.get("downgrade_package", {})
    for name, table in (("rate", rate), ("sandbox", sandbox), ("timeouts", timeouts),
                        ("free_space", free), ("downgrade_package", downgrade)):
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{name}] must be a table")
    bwrap = sandbox.get("bwrap", "/usr/bin/bwrap")
    python = sandbox.get("python")
    allow_weaker = sandbox.get("allow_weaker", False)
    if not isinstance(bwrap, str) or (python is not None and not isinstance(python, str)):
        raise ConfigError(f"{where}: sandbox.bwrap and sandbox.python must be paths")
    if not isinstance(allow_weaker, bool):
        raise ConfigError(f"{where}: sandbox.allow_weaker must be true or false")
    address = data.get("dbus_address")
    if address is not None and not isinstance(address, str):
        raise ConfigError(f"{where}: dbus_address must be a D-Bus address")
    context = data.get("context_socket")
    journal_dirs = free.get("journal_dirs", ["/var/log/journal", "/run/log/journal"])
    if not isinstance(journal_dirs, list):
        raise ConfigError(f"{where}: free_space.journal_dirs must be a list of paths")
    return Config(
        unit_dirs=tuple(_path(d, "unit_dirs", where) for d in dirs),
        cache_root=_path(data.get("cache_root", "/var/cache"), "cache_root", where),
        allow=_patterns(data, "allow", ("*.service",), where),
        deny=_patterns(data, "deny", DEFAULT_DENY, where),
        sentry_uid=sentry_uid,
        dbus_address=address,
        context_socket=None if context is None else _path(context, "context_socket", where),
        rate=RateLimit(
            per_unit=int(number(rate, "per_unit", 3, where, minimum=1)),
            per_unit_window=number(rate, "per_unit_window_sec", 60, where),
            total=int(number(rate, "global", 20, where, minimum=1)),
            total_window=number(rate, "global_window_sec", 60, where),
        ),
        bwrap=bwrap,
        python=python,
        allow_weaker=allow_weaker,
        sandbox_timeout=number(sandbox, "timeout_sec", 30, where, minimum=1),
        job_timeout=number(timeouts, "job_sec", 60, where, minimum=0.1),
        health_window=number(timeouts, "health_window_sec", 3, where),
        journal_dirs=tuple(_path(d, "free_space.journal_dirs", where) for d in journal_dirs),
        journal_keep=integer(free, "journal_keep_mib", 64, where, minimum=1) << 20,
        archives=_path(downgrade.get("archives", "/var/cache/apt/archives"),
                       "downgrade_package.archives", where),
        dpkg_status=_path(downgrade.get("status", "/var/lib/dpkg/status"),
                          "downgrade_package.status", where),
    )


def load(path: Path) -> Config:
    return parse(load_toml(path), str(path))
