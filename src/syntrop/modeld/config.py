"""modeld.toml, validated into a record.

    [store]
    directory = "/var/lib/syntrop/models"   # default: $STATE_DIRECTORY
    budget_bytes = 53687091200              # what Prune fits the store into (unset: no budget)
    min_free_bytes = 1073741824             # never fill the filesystem past this (default 0)
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syntrop.config import ConfigError, Paths, load_toml


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    directory: Path
    budget_bytes: int | None = None
    min_free_bytes: int = 0


def _bytes(table: dict[str, Any], key: str, where: str) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: store.{key} must be a number of bytes")
    return value


def parse(data: dict[str, Any], paths: Paths, where: str = "modeld.toml") -> Config:
    store = data.get("store", {})
    if not isinstance(store, dict):
        raise ConfigError(f"{where}: [store] must be a table")
    directory = store.get("directory")
    if directory is not None and (not isinstance(directory, str) or not directory):
        raise ConfigError(f"{where}: store.directory must be a path")
    return Config(
        directory=Path(directory) if directory else paths.state,
        budget_bytes=_bytes(store, "budget_bytes", where),
        min_free_bytes=_bytes(store, "min_free_bytes", where) or 0,
    )


def load(paths: Paths) -> Config:
    path = paths.configuration / "modeld.toml"
    return parse(load_toml(path), paths, str(path))
