"""sentry.toml, validated into a record.

    ignore = ["foo.service"]      # units (fnmatch patterns) sentry leaves alone
    watch_syntrop = false         # also triage syntrop's own units
    recent_sec = 600              # a drop-in changed this close before a failure is blamed
    queue = 64                    # failure signals waiting for triage; more are dropped
    sysfs_root = "/"              # where gang triage finds /sys (PCI addresses of planes)

    [budgets]                     # milliseconds per phase
    context = 1000
    gang = 1000
    lease = 1000
    decide = 1800
    execute = 30000
    verify = 10000
    release = 500

    [breaker]
    window_sec = 600
    cap = 3
    base_sec = 10
    factor = 2.0
    max_sec = 300
"""

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syntrop.config import ConfigError, load_toml
from syntrop.sentry.breaker import SECOND, Policy
from syntrop.sentry.pipeline import MS, Budgets

#: syntrop's own units: sentry must not heal itself or its peers by default.
OWN_UNITS = ("systemd-sentry.*", "inferenced.*", "modeld.*", "contextd.*", "toold.*",
             "runtimed.*", "routerd.*", "syntrop-*", "ai.slice")


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    ignore: tuple[str, ...] = ()
    watch_syntrop: bool = False
    recent_usec: int = 600 * SECOND
    queue: int = 64
    sysfs_root: Path = Path("/")
    budgets: Budgets = field(default_factory=Budgets)
    policy: Policy = field(default_factory=Policy)

    def ignored(self, unit: str) -> bool:
        patterns = self.ignore if self.watch_syntrop else self.ignore + OWN_UNITS
        return any(fnmatch.fnmatchcase(unit, p) for p in patterns)


def _number(table: dict[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{where}: {key} must be a number >= 0")
    return float(value)


def parse(data: dict[str, Any], where: str = "sentry.toml") -> Config:
    ignore = data.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise ConfigError(f"{where}: ignore must be a list of strings")
    budgets = data.get("budgets", {})
    breaker = data.get("breaker", {})
    if not isinstance(budgets, dict) or not isinstance(breaker, dict):
        raise ConfigError(f"{where}: [budgets] and [breaker] must be tables")
    sysfs_root = data.get("sysfs_root", "/")
    if not isinstance(sysfs_root, str) or not sysfs_root.startswith("/"):
        raise ConfigError(f"{where}: sysfs_root must be an absolute path")
    d = Budgets()

    def ms(key: str, default_usec: int) -> int:
        return int(_number(budgets, key, default_usec / MS, where) * MS)

    try:
        policy = Policy(
            window_usec=int(_number(breaker, "window_sec", 600, where) * SECOND),
            cap=int(_number(breaker, "cap", 3, where)),
            base_usec=int(_number(breaker, "base_sec", 10, where) * SECOND),
            factor=_number(breaker, "factor", 2.0, where),
            max_usec=int(_number(breaker, "max_sec", 300, where) * SECOND))
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None
    return Config(
        ignore=tuple(ignore),
        watch_syntrop=bool(data.get("watch_syntrop", False)),
        recent_usec=int(_number(data, "recent_sec", 600, where) * SECOND),
        queue=max(1, int(_number(data, "queue", 64, where))),
        sysfs_root=Path(sysfs_root),
        budgets=Budgets(
            context_usec=ms("context", d.context_usec), gang_usec=ms("gang", d.gang_usec),
            lease_usec=ms("lease", d.lease_usec),
            decide_usec=ms("decide", d.decide_usec), execute_usec=ms("execute", d.execute_usec),
            verify_usec=ms("verify", d.verify_usec), release_usec=ms("release", d.release_usec)),
        policy=policy)


def load(directory: Path) -> Config:
    path = directory / "sentry.toml"
    return parse(load_toml(path), str(path))
