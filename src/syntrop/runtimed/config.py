"""runtimed's configuration: $CONFIGURATION_DIRECTORY/runtimed.toml.

    [runtimed]
    slots = 4          # concurrent contexts (sessions and streams)
    queue = 8          # requests that may wait for a slot; more get Busy
    n_ctx = 2048       # default context window
    n_threads = 0      # most threads per context; 0 for all CPUs
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

import tomllib
from dataclasses import dataclass
from pathlib import Path

from syntrop.runtimed.layout import LAYOUTS

FILE = "runtimed.toml"
INTEGERS = ("slots", "queue", "n_ctx", "n_threads", "instances", "spill_ram", "crash_limit")


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

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"{FILE}: layout is one of {', '.join(LAYOUTS)}")
        if self.crash_window <= 0:
            raise ValueError(f"{FILE}: crash_window must be positive")
        if self.keep_alive < 0 or any(getattr(self, k) < 0 for k in INTEGERS):
            raise ValueError(f"{FILE}: negative value")
        if not 0 <= self.unload_pressure <= 100:
            raise ValueError(f"{FILE}: unload_pressure is a percentage, 0 to 100")


def load(directory: Path) -> Config:
    """The configuration in `directory`, defaults where absent."""
    try:
        data = tomllib.loads((directory / FILE).read_text())
    except FileNotFoundError:
        return Config()
    section = data.get("runtimed", {})
    values: dict[str, object] = {k: int(section[k]) for k in INTEGERS if k in section}
    if "layout" in section:
        values["layout"] = str(section["layout"])
    for key in ("keep_alive", "crash_window"):
        if key in section:
            values[key] = float(section[key])
    if "unload_pressure" in section:
        values["unload_pressure"] = float(section["unload_pressure"])
    if "pressure_file" in section:
        values["pressure_file"] = str(section["pressure_file"])
    return Config(**values)  # type: ignore[arg-type]
