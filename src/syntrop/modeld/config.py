"""modeld.toml, validated into a record.

    [store]
    directory = "/var/lib/syntrop/models"   # default: $STATE_DIRECTORY
    budget_bytes = 53687091200              # what Prune fits the store into (unset: no budget)
    min_free_bytes = 1073741824             # never fill the filesystem past this (default 0)
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syntrop.config import Paths, integer, load_toml, section, string


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    directory: Path
    budget_bytes: int | None = None
    min_free_bytes: int = 0


def parse(data: dict[str, Any], paths: Paths, where: str = "modeld.toml") -> Config:
    store = section(data, "store", where)
    at = f"{where}: [store]"
    directory = string(store, "directory", str(paths.state), at)
    budget = store.get("budget_bytes")
    return Config(
        directory=Path(directory),
        budget_bytes=None if budget is None else integer(store, "budget_bytes", 0, at),
        min_free_bytes=integer(store, "min_free_bytes", 0, at),
    )


def load(paths: Paths) -> Config:
    path = paths.configuration / "modeld.toml"
    return parse(load_toml(path), paths, str(path))
