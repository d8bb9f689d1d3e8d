"""Where things live.

Every path a daemon or CLI touches comes from here, and every one of them is
taken from systemd's variables first (RUNTIME_DIRECTORY, STATE_DIRECTORY,
CACHE_DIRECTORY, CONFIGURATION_DIRECTORY), so the same code runs under
systemd, under `syn up` and in tests that only set those variables.

systemd may pass several directories separated by ':' when a unit lists more
than one; the first is ours.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNTIME_DEFAULT = "/run/syntrop"
STATE_DEFAULT = "/var/lib/syntrop"
CACHE_DEFAULT = "/var/cache/syntrop"
CONFIGURATION_DEFAULT = "/etc/syntrop"

#: Varlink interfaces served by the suite, in the order `syn up` lists them.
INTERFACES = (
    "io.syntrop.Inference1",
    "io.syntrop.Model1",
    "io.syntrop.Context1",
    "io.syntrop.Tool1",
    "io.syntrop.Runtime1",
    "io.syntrop.Sentry1",
    "io.syntrop.Router1",
)


def _first(variable: str, default: str) -> Path:
    value = os.environ.get(variable, "")
    first = value.split(":", 1)[0]
    return Path(first) if first else Path(default)


@dataclass(frozen=True, slots=True, kw_only=True)
class Paths:
    """The four directories of one daemon or CLI invocation."""

    runtime: Path
    state: Path
    cache: Path
    configuration: Path

    @classmethod
    def from_environment(cls) -> "Paths":
        return cls(
            runtime=_first("RUNTIME_DIRECTORY", RUNTIME_DEFAULT),
            state=_first("STATE_DIRECTORY", STATE_DEFAULT),
            cache=_first("CACHE_DIRECTORY", CACHE_DEFAULT),
            configuration=_first("CONFIGURATION_DIRECTORY", CONFIGURATION_DEFAULT),
        )

    def socket(self, interface: str) -> Path:
        """The socket a Varlink interface is served on: $RUNTIME_DIRECTORY/<interface>."""
        return self.runtime / interface


def paths() -> Paths:
    return Paths.from_environment()


class ConfigError(Exception):
    """A configuration file exists but cannot be used; the message says where."""


def load_toml(path: Path) -> dict[str, Any]:
    """A daemon's TOML configuration; an absent file is an empty one."""
    import tomllib

    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: {error}") from None
