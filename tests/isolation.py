"""Test modules that load llama.cpp into the test process run in a child
pytest of their own, so that a native crash fails that test, not the run.

A module says so with `pytestmark = pytest.mark.isolated`. When the run
reaches its first test, the parent starts `python -m pytest` on that module
with the selected tests, collects each test's reports as the child writes
them (pytest's own report serialisation, one JSON line each), and replays
them here, so the terminal, -x, -ra and the tier summary see them as if
they had run in this process. If the child dies (SIGSEGV in llama.cpp, an
abort), the test it was running fails with the signal and the tail of the
child's output, and a new child runs the tests that were left.

Everything a test in the child starts dies with the child (tests/support.py
starts daemons with a parent-death signal).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

MARK = "isolated"
#: Set in the child: report there, do not isolate again.
CHILD = "SYNTROP_ISOLATED_CHILD"
SELECT = "SYNTROP_ISOLATED_SELECT"
REPORTS = "SYNTROP_ISOLATED_REPORTS"
#: Lines of the child's output shown with a crash.
TAIL = 40


def configure(config: pytest.Config) -> None:
    """Called from tests/conftest.py's pytest_configure."""
    config.addinivalue_line(
        "markers", f"{MARK}: loads llama.cpp into the test process: runs in a child pytest")
    if os.environ.get(CHILD):
        config.pluginmanager.register(Child(config), "syntrop-isolated-child")
    else:
        config.pluginmanager.register(Parent(config), "syntrop-isolated-parent")


class Child:
    """In the child: run only the selected tests, write every report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.out = open(os.environ[REPORTS], "a", buffering=1)  # noqa: SIM115 (lives with the run)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        wanted = set(Path(os.environ[SELECT]).read_text().splitlines())
        kept = [item for item in items if item.nodeid in wanted]
        dropped = [item for item in items if item.nodeid not in wanted]
        if dropped:
            self.config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.out.write(json.dumps({"start": nodeid}) + "\n")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.out.write(json.dumps({"report": data}) + "\n")


class Parent:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        #: Serialised reports by test, from children that have run.
        self.results: dict[str, list[dict[str, Any]]] = {}
        #: A failure to report for a test whose child died while running it.
        self.crashes: dict[str, str] = {}
        self.ran: set[str] = set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        if item.get_closest_marker(MARK) is None:
            return None
        module = item.nodeid.split("::")[0]
        if module not in self.ran:
            self.ran.add(module)
            self._run(module, [i for i in item.session.items if i.nodeid.split("::")[0] == module])
        hook = item.ihook
        hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for data in self.results.pop(item.nodeid, []):
            report = self.config.hook.pytest_report_from_serializable(config=self.config,
                                                                      data=data)
            hook.pytest_runtest_logreport(report=report)
        if item.nodeid in self.crashes:
            hook.pytest_runtest_logreport(report=pytest.TestReport(
                nodeid=item.nodeid, location=item.location, keywords={}, outcome="failed",
                longrepr=self.crashes.pop(item.nodeid), when="call"))
        hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _run(self, module: str, items: list[pytest.Item]) -> None:
        """Run `items` of `module` in children until every one has reports."""
        left = [item.nodeid for item in items]
        while left:
            with tempfile.TemporaryDirectory(prefix="syntrop-isolated-") as scratch:
                select, reports = Path(scratch) / "select", Path(scratch) / "reports"
                output = Path(scratch) / "output"
                select.write_text("\n".join(left) + "\n")
                env = {**os.environ, CHILD: "1", SELECT: str(select), REPORTS: str(reports)}
                with output.open("wb") as sink:
                    done = subprocess.run(
                        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "--no-header", "-o", "console_output_style=classic", module],
                        cwd=self.config.rootpath, env=env, stdin=subprocess.DEVNULL,
                        stdout=sink, stderr=subprocess.STDOUT, check=False)
                running, finished = self._read(reports)
                tail = _tail(output.read_text(errors="replace"))
            left = [nodeid for nodeid in left if nodeid not in finished]
            if not left:
                return
            crashed = running if running in left else None
            how = _how(done.returncode)
            if crashed is None:
                # The child ended before it reached these (collection failed,
                # or it died between tests): report them all, do not loop.
                for nodeid in left:
                    self.crashes[nodeid] = (f"the isolated child pytest {how} before this test "
                                            "ran; its output:\n" + "\n".join(tail))
                return
            self.crashes[crashed] = (f"the isolated child pytest {how} while running this test "
                                     "(llama.cpp runs in that child, not in this process); "
                                     "its output:\n" + "\n".join(tail))
            left.remove(crashed)

    def _read(self, reports: Path) -> tuple[str | None, set[str]]:
        """The test last started, and the tests with their teardown report."""
        running, finished = None, set()
        try:
            lines = reports.read_text().splitlines()
        except FileNotFoundError:
            return None, set()
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by the crash
            if "start" in entry:
                running = entry["start"]
                continue
            data = entry["report"]
            nodeid = data.get("nodeid", "")
            self.results.setdefault(nodeid, []).append(data)
            if data.get("when") == "teardown":
                finished.add(nodeid)
                running = None
        return running, finished


def _tail(output: str) -> list[str]:
    """What the child said about its death: from Python's fatal-error report
    on (its stacks without pytest's own frames), else its last lines."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "Fatal Python error" in line),
                 None)
    if start is None:
        return lines[-TAIL:]
    noise = ("/_pytest/", "/pluggy/", "<frozen runpy>", "/pytest/__main__.py")
    return [line for line in lines[start:] if not any(n in line for n in noise)][:TAIL]


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"
