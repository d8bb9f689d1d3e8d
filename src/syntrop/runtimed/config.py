"""runtimed's configuration: $CONFIGURATION_DIRECTORY/runtimed.toml.

    [runtimed]
    slots = 4          # concurrent contexts (sessions and streams)
    queue = 8          # requests that may wait for a slot; more get Busy
    n_ctx = 2048       # default context window
    n_threads = 0      # threads per context; 0 for all CPUs
"""

import tomllib
from dataclasses import dataclass
from pathlib import Path

FILE = "runtimed.toml"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    slots: int = 4
    queue: int = 8
    n_ctx: int = 2048
    n_threads: int = 0


def load(directory: Path) -> Config:
    """The configuration in `directory`, defaults where absent."""
    try:
        data = tomllib.loads((directory / FILE).read_text())
    except FileNotFoundError:
        return Config()
    section = data.get("runtimed", {})
    values = {k: int(section[k]) for k in ("slots", "queue", "n_ctx", "n_threads") if k in section}
    return Config(**values)
