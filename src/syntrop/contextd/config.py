"""contextd.toml, validated into a record. Every host path contextd reads
comes from here, so tests point it at temporary directories.

    unit_dirs = ["/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system"]
    reference_prefixes = ["/etc/"]   # referenced files (EnvironmentFile=) watched under these
    exit_on_idle = false             # true: exit when idle; changes made while down are
                                     # found at the next start, without pid or steps between

    [timeline]
    ring_size = 100000               # events kept (persisted)
    retention_days = 30              # older events are dropped; the largest window
    default_window_hours = 24        # GetUnitContext's window when none is given
    flood_rate = 1000                # file and kernel events per second before dropping
    flood_burst = 5000

    [files]
    max_file_bytes = 262144          # larger files: recorded as changed, never diffed
    max_shadow_bytes = 67108864      # content kept in all to diff against
    max_diff_bytes = 65536           # a longer diff is cut
    max_watches = 4096

    [packages]
    dpkg_log = "/var/log/dpkg.log"
    apt_history = "/var/log/apt/history.log"
    dnf_log = "/var/log/dnf.rpm.log"
    dpkg_info = "/var/lib/dpkg/info"

    [journal]
    journalctl = "journalctl"
    directory = ""                   # journalctl --directory
    files = []                       # journalctl --file (no following: polled)
    lines_before = 40
    lines_after = 20
    after_seconds = 30
    kernel = true                    # kernel events (OOM, segfaults, GPU) from the journal
                                     # (journalctl = "" turns the journal off altogether)
"""

from dataclasses import dataclass, field
from typing import Any

from syntrop.config import ConfigError, integer, load_toml, number, section
from syntrop.system.journal import Source

USEC = 1_000_000
HOUR = 3600 * USEC
DAY = 24 * HOUR

DEFAULT_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system")


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    unit_dirs: tuple[str, ...] = DEFAULT_UNIT_DIRS
    reference_prefixes: tuple[str, ...] = ("/etc/",)
    exit_on_idle: bool = False

    ring_size: int = 100_000
    retention_usec: int = 30 * DAY
    default_window_usec: int = 24 * HOUR
    flood_rate: float = 1000.0
    flood_burst: int = 5000

    max_file_bytes: int = 256 * 1024
    max_shadow_bytes: int = 64 * 1024 * 1024
    max_diff_bytes: int = 64 * 1024
    max_watches: int = 4096
    max_references: int = 256

    dpkg_log: str | None = "/var/log/dpkg.log"
    apt_history: str | None = "/var/log/apt/history.log"
    dnf_log: str | None = "/var/log/dnf.rpm.log"
    dpkg_info: str = "/var/lib/dpkg/info"

    journal: Source = field(default_factory=Source)
    lines_before: int = 40
    lines_after: int = 20
    after_usec: int = 30 * USEC
    kernel: bool = True


def _paths(
    table: dict[str, Any], key: str, default: tuple[str, ...], where: str
) -> tuple[str, ...]:
    value = table.get(key, list(default))
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {key} must be a list of paths")
    return tuple(value)


def _path(table: dict[str, Any], key: str, default: str | None, where: str) -> str | None:
    value = table.get(key, default)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a path")
    return value


def parse(data: dict[str, Any], where: str = "contextd.toml") -> Config:
    default = Config()
    timeline = section(data, "timeline", where)
    files = section(data, "files", where)
    packages = section(data, "packages", where)
    journal = section(data, "journal", where)
    exit_on_idle = data.get("exit_on_idle", False)
    if not isinstance(exit_on_idle, bool):
        raise ConfigError(f"{where}: exit_on_idle must be true or false")
    # An empty journalctl turns journal slices and kernel events off.
    journalctl = journal.get("journalctl", "journalctl")
    if not isinstance(journalctl, str):
        raise ConfigError(f"{where}: journal.journalctl must be a path or empty")
    source = Source(
        journalctl=journalctl,
        directory=_path(journal, "directory", None, where),
        files=_paths(journal, "files", (), where),
    )
    kernel = journal.get("kernel", True)
    if not isinstance(kernel, bool):
        raise ConfigError(f"{where}: journal.kernel must be true or false")
    return Config(
        unit_dirs=_paths(data, "unit_dirs", default.unit_dirs, where),
        reference_prefixes=_paths(data, "reference_prefixes", default.reference_prefixes, where),
        exit_on_idle=exit_on_idle,
        ring_size=integer(timeline, "ring_size", default.ring_size, where, minimum=1),
        retention_usec=integer(timeline, "retention_days", 30, where, minimum=1) * DAY,
        default_window_usec=integer(timeline, "default_window_hours", 24, where, minimum=1) * HOUR,
        flood_rate=number(timeline, "flood_rate", default.flood_rate, where, positive=True),
        flood_burst=integer(timeline, "flood_burst", default.flood_burst, where, minimum=1),
        max_file_bytes=integer(files, "max_file_bytes", default.max_file_bytes, where),
        max_shadow_bytes=integer(files, "max_shadow_bytes", default.max_shadow_bytes, where),
        max_diff_bytes=integer(files, "max_diff_bytes", default.max_diff_bytes, where, minimum=256),
        max_watches=integer(files, "max_watches", default.max_watches, where, minimum=1),
        dpkg_log=_path(packages, "dpkg_log", default.dpkg_log, where),
        apt_history=_path(packages, "apt_history", default.apt_history, where),
        dnf_log=_path(packages, "dnf_log", default.dnf_log, where),
        dpkg_info=_path(packages, "dpkg_info", default.dpkg_info, where) or default.dpkg_info,
        journal=source,
        lines_before=integer(journal, "lines_before", default.lines_before, where),
        lines_after=integer(journal, "lines_after", default.lines_after, where),
        after_usec=integer(journal, "after_seconds", 30, where) * USEC,
        kernel=kernel and bool(journalctl),
    )


def load(path: str) -> Config:
    from pathlib import Path

    return parse(load_toml(Path(path)), path)
