"""Tiers, and the closing line that says which tier ran how many tests.

A test's tier is its directory: tests/unit, tests/service, tests/system. The
marker is added here so `pytest -m service` selects a tier. Modules marked
`isolated` (they load llama.cpp in-process) run in a child pytest each
(tests/isolation.py), so a native crash fails a test and the run goes on.
"""

import collections
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import isolation

TIERS = ("unit", "service", "system", "security")
_ROOT = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    isolation.configure(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        relative = Path(str(item.fspath)).relative_to(_ROOT)
        tier = relative.parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def _tier(report: pytest.TestReport) -> str:
    parts = Path(report.nodeid.split("::")[0]).parts
    return parts[1] if len(parts) > 1 and parts[1] in TIERS else "other"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    skipped_reasons: dict[str, set[str]] = collections.defaultdict(set)
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if not isinstance(report, pytest.TestReport):
                continue
            if outcome == "passed" and report.when != "call":
                continue
            tier = _tier(report)
            counts[tier][outcome] += 1
            if outcome == "skipped" and isinstance(report.longrepr, tuple):
                skipped_reasons[tier].add(str(report.longrepr[2]).removeprefix("Skipped: "))
    terminalreporter.section("tiers")
    for tier in (*TIERS, "other"):
        if tier not in counts and tier != "other":
            terminalreporter.write_line(f"{tier:8} not run")
            continue
        if tier == "other" and tier not in counts:
            continue
        c = counts[tier]
        terminalreporter.write_line(
            f"{tier:8} {c['passed']} passed, {c['failed'] + c['error']} failed, "
            f"{c['skipped']} skipped"
        )
        for reason in sorted(skipped_reasons[tier]):
            terminalreporter.write_line(f"{'':8} skipped because: {reason}")


def _children() -> list[str]:
    """Live (non-zombie) child processes of this test process."""
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)
        except OSError:
            continue
        state, ppid = fields[1].split()[:2]
        if ppid == me and state != "Z":
            found.append(f"{entry} {fields[0].split('(', 1)[1]}")
    return found


@pytest.fixture(autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """Fail a test that leaves a child process running (cockpit's
    _check_settled idea): every fixture must kill what it started."""
    before = set(_children())
    yield
    deadline = time.monotonic() + 2
    while (left := set(_children()) - before) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left, f"test left processes running: {sorted(left)}"
