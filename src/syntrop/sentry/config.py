"""sentry.toml, validated into a record.

    ignore = ["foo.service"]      # units (fnmatch patterns) sentry leaves alone: no incident
    protected = ["db-*.service"]  # units that get an incident "protected: no action" and
                                  # nothing else; added to the defaults (PROTECTED)
    watch_syntrop = false         # also triage syntrop's own units
    recent_sec = 600              # how far back contextd's changes are read
    verify_sec = 5                # a healed unit stays active at least this long (and
                                  # longer than it lived before failing), at most verify_max_sec
    verify_max_sec = 12
    model = "qwen2.5-coder-0.5b"  # the triage model's name in modeld; default: chosen
                                  # at each incident from what modeld holds now:
                                  # qwen2.5-coder-0.5b, else -1.5b, else none (the
                                  # rules decide); smollm2 only when named here
    queue = 64                    # failure signals waiting for triage; more are dropped
    sysfs_root = "/"              # where gang triage finds /sys (PCI addresses of planes)
    warm_session = true           # keep a runtimed session with the prompt's stable part
                                  # (false: a Runtime1.Chat with the whole prompt per incident)

    [budgets]                     # milliseconds per phase
    context = 1000
    gang = 1000
    lease = 1000
    decide = 1800                 # from when the incident's turn is handed to the model
    decide_ready = 20000          # waiting for the warm session (being opened) before that
    execute = 30000
    verify = 15000
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

from syntrop.config import ConfigError, load_toml, number
from syntrop.sentry.breaker import SECOND, Policy
from syntrop.sentry.pipeline import MS, Budgets

#: syntrop's own units: sentry must not heal itself or its peers by default.
OWN_UNITS = ("systemd-sentry.*", "inferenced.*", "modeld.*", "contextd.*", "toold.*",
             "runtimed.*", "routerd.*", "syntrop-*", "ai.slice")
#: Units sentry never acts on (an incident says so): the system's own
#: plumbing, remote access, and syntrop's daemons.
PROTECTED = ("dbus.service", "dbus-broker.service", "dbus.socket", "systemd-*", "ssh.service",
             "sshd.service", "ssh.socket", "getty@*.service", "serial-getty@*.service",
             "init.scope", "-.mount", "-.slice", "*.target", *OWN_UNITS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    ignore: tuple[str, ...] = ()
    protected: tuple[str, ...] = PROTECTED
    watch_syntrop: bool = False
    recent_usec: int = 600 * SECOND
    verify_usec: int = 5 * SECOND
    verify_max_usec: int = 12 * SECOND
    model: str | None = None
    queue: int = 64
    sysfs_root: Path = Path("/")
    warm_session: bool = True
    budgets: Budgets = field(default_factory=Budgets)
    policy: Policy = field(default_factory=Policy)

    def ignored(self, unit: str) -> bool:
        patterns = self.ignore if self.watch_syntrop else self.ignore + OWN_UNITS
        return any(fnmatch.fnmatchcase(unit, p) for p in patterns)

    def is_protected(self, unit: str) -> bool:
        return any(fnmatch.fnmatchcase(unit, p) for p in self.protected)


def parse(data: dict[str, Any], where: str = "sentry.toml") -> Config:
    ignore = data.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise ConfigError(f"{where}: ignore must be a list of strings")
    protected = data.get("protected", [])
    if not isinstance(protected, list) or not all(isinstance(i, str) for i in protected):
        raise ConfigError(f"{where}: protected must be a list of strings")
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model or len(model) > 256):
        raise ConfigError(f"{where}: model must be a model's name in modeld")
    budgets = data.get("budgets", {})
    breaker = data.get("breaker", {})
    if not isinstance(budgets, dict) or not isinstance(breaker, dict):
        raise ConfigError(f"{where}: [budgets] and [breaker] must be tables")
    sysfs_root = data.get("sysfs_root", "/")
    if not isinstance(sysfs_root, str) or not sysfs_root.startswith("/"):
        raise ConfigError(f"{where}: sysfs_root must be an absolute path")
    warm = data.get("warm_session", True)
    if not isinstance(warm, bool):
        raise ConfigError(f"{where}: warm_session must be true or false")
    d = Budgets()

    def ms(key: str, default_usec: int) -> int:
        return int(number(budgets, key, default_usec / MS, where) * MS)

    try:
        policy = Policy(
            window_usec=int(number(breaker, "window_sec", 600, where) * SECOND),
            cap=int(number(breaker, "cap", 3, where)),
            base_usec=int(number(breaker, "base_sec", 10, where) * SECOND),
            factor=number(breaker, "factor", 2.0, where),
            max_usec=int(number(breaker, "max_sec", 300, where) * SECOND))
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None
    verify = int(number(data, "verify_sec", 5, where) * SECOND)
    verify_max = int(number(data, "verify_max_sec", 12, where) * SECOND)
    if verify_max < verify:
        raise ConfigError(f"{where}: verify_max_sec must be at least verify_sec")
    return Config(
        ignore=tuple(ignore),
        protected=PROTECTED + tuple(protected),
        watch_syntrop=bool(data.get("watch_syntrop", False)),
        recent_usec=int(number(data, "recent_sec", 600, where) * SECOND),
        verify_usec=verify, verify_max_usec=verify_max, model=model,
        queue=max(1, int(number(data, "queue", 64, where))),
        sysfs_root=Path(sysfs_root), warm_session=warm,
        budgets=Budgets(
            context_usec=ms("context", d.context_usec), gang_usec=ms("gang", d.gang_usec),
            lease_usec=ms("lease", d.lease_usec),
            decide_usec=ms("decide", d.decide_usec),
            decide_ready_usec=ms("decide_ready", d.decide_ready_usec),
            execute_usec=ms("execute", d.execute_usec),
            verify_usec=ms("verify", d.verify_usec), release_usec=ms("release", d.release_usec)),
        policy=policy)


def load(directory: Path) -> Config:
    path = directory / "sentry.toml"
    return parse(load_toml(path), str(path))
