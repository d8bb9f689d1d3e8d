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
    """A daemon's TOML configuration; an absent file is an empty one. A
    syntax error names the file, line and column (tomllib's message).
    tomllib is imported only when there is a file: its import and regular
    expressions cost a cold start ~5 ms of CPU, and most hosts configure
    most daemons not at all."""
    try:
        with path.open("rb") as file:
            import tomllib

            try:
                return tomllib.load(file)
            except tomllib.TOMLDecodeError as error:
                raise ConfigError(f"{path}: {error}") from None
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise ConfigError(f"{path}: {error}") from None


# The readers of a configuration's fields, shared by the seven daemons: each
# takes the TOML table, the key, the default and `where` (the file, and the
# table when not the top: "runtimed.toml: [runtimed]"), and raises a
# ConfigError naming all of them, what was expected and what was found.


def _bad(where: str, key: str, expected: str, value: object) -> ConfigError:
    return ConfigError(f"{where}: {key} must be {expected}, not {value!r}")


def number(table: dict[str, Any], key: str, default: float, where: str, *,
           minimum: float = 0.0, maximum: float = float("inf"),
           positive: bool = False) -> float:
    """A number from `minimum` to `maximum` (above 0 with `positive`)."""
    value = table.get(key, default)
    low = "above 0" if positive else f">= {minimum:g}"
    expected = f"a number {low}" + (f" and <= {maximum:g}" if maximum < float("inf") else "")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum \
            or value > maximum or (positive and not value > 0):
        raise _bad(where, key, expected, value)
    return float(value)


def integer(table: dict[str, Any], key: str, default: int, where: str, *,
            minimum: int = 0, maximum: int | None = None) -> int:
    """An integer from `minimum` to `maximum` (a quoted "8" is not one)."""
    value = table.get(key, default)
    expected = f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        raise _bad(where, key, expected, value)
    return value


def boolean(table: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise _bad(where, key, "true or false", value)
    return value


def string(table: dict[str, Any], key: str, default: str, where: str, *,
           choices: tuple[str, ...] = (), empty: bool = False) -> str:
    """A string (non-empty unless `empty`; one of `choices` when given)."""
    value = table.get(key, default)
    if not isinstance(value, str) or (not empty and not value) or (
            choices and value not in choices):
        expected = f"one of {', '.join(choices)}" if choices else "a non-empty string"
        raise _bad(where, key, expected, value)
    return value


def section(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """Table `key` of `data` ({} when absent)."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise _bad(where, f"[{key}]", "a table", value)
    return value
