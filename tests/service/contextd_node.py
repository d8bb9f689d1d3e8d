"""contextd's service tests share these: a contextd watching temporary unit
directories (its configuration written for the test), calls over its
socket, waiting for an event, and real journal files written by
systemd-journal-remote."""

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.service.wire import Running, running
from tests.support import declared_error, varlink_call

BOOT = "0123456789abcdef0123456789abcdef"
NAME = "io.syntrop.Context1"


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def configure(root: Path, units: list[Path], *, top: str = "", **tables: dict[str, Any]) -> None:
    """Write root/config/contextd.toml: `units` watched, nothing of the host
    read (no package logs, no journal) unless a table says otherwise."""
    sections: dict[str, dict[str, Any]] = {
        "packages": {"dpkg_log": "", "apt_history": "", "dnf_log": "",
                     "dpkg_info": str(root / "info")},
        "journal": {"journalctl": ""},
    }
    for name, values in tables.items():
        sections.setdefault(name, {}).update(values)
    lines = [f"unit_dirs = {toml_list([str(u) for u in units])}",
             f"reference_prefixes = {toml_list([str(root) + '/'])}", top]
    for name, values in sections.items():
        lines.append(f"[{name}]")
        for key, value in values.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, int | float):
                lines.append(f"{key} = {value}")
            elif isinstance(value, list):
                lines.append(f"{key} = {toml_list(value)}")
            else:
                lines.append(f'{key} = "{value}"')
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "contextd.toml").write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def contextd(root: Path, units: list[Path], *, top: str = "",
             idle_timeout: float = 0, **tables: dict[str, Any]) -> Iterator[Running]:
    configure(root, units, top=top, **tables)
    with running("contextd", root, idle_timeout=idle_timeout) as daemon:
        # contextd answers at once and starts watching behind the first
        # reply; GetStatus waits until it watches, as a client that is
        # about to make changes would.
        call(daemon, "GetStatus")
        yield daemon
        daemon.assert_healthy()


def call(daemon: Running, method: str, **params: Any) -> Any:
    return varlink_call(daemon.address, NAME, method, **params)


def error_of(daemon: Running, method: str, **params: Any) -> tuple[str, dict[str, Any]]:
    return declared_error(call, daemon, method, **params)


def events(daemon: Running, **params: Any) -> list[dict[str, Any]]:
    found = call(daemon, "ListEvents", **params)["events"]
    assert isinstance(found, list)
    return found


def wait_event(daemon: Running, match: Callable[[dict[str, Any]], bool],
               timeout: float = 5) -> dict[str, Any]:
    """The first event `match` accepts, polling until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        for event in events(daemon):
            if match(event):
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"no such event within {timeout} s; timeline: "
                                 f"{[e['summary'] for e in events(daemon)]}")
        time.sleep(0.02)


def on(path: Path, action: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("path") == str(path) and e["action"] == action


def diff_of(daemon: Running, event: dict[str, Any]) -> str:
    diff = call(daemon, "GetEvent", id=event["id"])["event"]["diff"]
    assert isinstance(diff, str)
    return diff



# journal files ------------------------------------------------------------------


def journal_remote() -> str | None:
    found = shutil.which("systemd-journal-remote")
    for candidate in (found, "/lib/systemd/systemd-journal-remote",
                      "/usr/lib/systemd/systemd-journal-remote"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def export(entries: list[dict[str, Any]]) -> str:
    """Journal export format: FIELD=value lines, a blank line after each."""
    blocks = []
    for fields in entries:
        ts = int(fields.pop("ts"))
        lines = [f"__REALTIME_TIMESTAMP={ts}", f"__MONOTONIC_TIMESTAMP={ts % 10**12}",
                 f"_BOOT_ID={BOOT}", "_HOSTNAME=test"]
        lines += [f"{key}={value}" for key, value in fields.items()]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def write_journal(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write (or append to) a real journal file with systemd-journal-remote."""
    tool = journal_remote()
    assert tool is not None
    source = path.with_suffix(".export")
    source.write_text(export(entries))
    result = subprocess.run([tool, f"--output={path}", str(source)], capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr


def kernel(ts: int, message: str) -> dict[str, Any]:
    return {"ts": ts, "MESSAGE": message, "PRIORITY": 3, "_TRANSPORT": "kernel",
            "SYSLOG_IDENTIFIER": "kernel"}
