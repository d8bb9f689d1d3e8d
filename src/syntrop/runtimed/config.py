"""runtimed's configuration: $CONFIGURATION_DIRECTORY/runtimed.toml.

    [runtimed]
    slots = 4          # concurrent contexts (sessions and streams)
    queue = 8          # requests that may wait for a slot; more get Busy
    n_ctx = 2048       # default context window
    n_threads = 0      # most threads per context; 0: every core of the plane
    layout = "auto"    # auto, instances, threads or batch (layout.py)
    instances = 0      # layout "instances": contexts computing side by
                       # side, n_threads / instances threads each; 0: one per CPU
    keep_alive = 300   # seconds an idle model stays resident
    spill_ram = 268435456  # bytes of spilled session state kept in memory;
                           # more goes to files under $STATE_DIRECTORY
    unload_pressure = 25.0 # memory PSI (some, avg10, percent) above which
                           # idle models are unloaded at once; 0: never
    pressure_file = "/proc/pressure/memory"  # or a cgroup's memory.pressure
    crash_limit = 3    # engine crashes of one model within crash_window
                       # after which it is refused; 0: never refused
    crash_window = 60  # seconds
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syntrop.config import ConfigError, integer, load_toml, number, section, string
from syntrop.runtimed.layout import LAYOUTS

FILE = "runtimed.toml"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    slots: int = 4
    queue: int = 8
    n_ctx: int = 2048
    n_threads: int = 0
    layout: str = "auto"
    instances: int = 0
    keep_alive: float = 300.0
    spill_ram: int = 256 << 20
    unload_pressure: float = 25.0
    pressure_file: str = "/proc/pressure/memory"
    crash_limit: int = 3
    crash_window: float = 60.0


def parse(data: dict[str, Any], path: str = FILE) -> Config:
    """runtimed.toml's [runtimed] table; ConfigError naming file, key and
    what was expected."""
    table = section(data, "runtimed", path)
    where = f"{path}: [runtimed]"
    d = Config()
    return Config(
        slots=integer(table, "slots", d.slots, where, minimum=1),
        queue=integer(table, "queue", d.queue, where),
        n_ctx=integer(table, "n_ctx", d.n_ctx, where, minimum=16),
        n_threads=integer(table, "n_threads", d.n_threads, where),
        layout=string(table, "layout", d.layout, where, choices=LAYOUTS),
        instances=integer(table, "instances", d.instances, where),
        keep_alive=number(table, "keep_alive", d.keep_alive, where),
        spill_ram=integer(table, "spill_ram", d.spill_ram, where),
        unload_pressure=number(table, "unload_pressure", d.unload_pressure, where,
                               maximum=100),
        pressure_file=string(table, "pressure_file", d.pressure_file, where),
        crash_limit=integer(table, "crash_limit", d.crash_limit, where),
        crash_window=number(table, "crash_window", d.crash_window, where, positive=True),
    )


def load(directory: Path) -> Config:
    """The configuration in `directory`, defaults where absent."""
    path = directory / FILE
    return parse(load_toml(path), str(path))


__all__ = ["FILE", "Config", "ConfigError", "load", "parse"]
