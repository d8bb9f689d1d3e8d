"""Fixtures of the system tier: one real systemd per session, booted as PID 1
in private namespaces (tests/system/instance.py), syntrop installed into it
by scripts/install from a wheelhouse built from this checkout, and
syntrop-sockets.target started.

Where the machine cannot do that (not root, no unshare, no cgroup2, ...) the
whole tier is skipped with one reason. Nothing is ever faked.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, varlinkctl
from tests.system.instance import PREFIX, WHEELHOUSE_INSIDE, Instance, unavailable

#: Hard time-to-live of the instance: it is SIGKILLed after this even if the
#: test process dies without cleaning up. The whole tier runs in one
#: instance: on a slow 2-core host it takes over 10 minutes, so the TTL is
#: CI's own budget (90 minutes), not a guess at the tier's length.
TTL = int(os.environ.get("SYNTROP_SYSTEM_TTL", "5400"))
#: Seconds spent on each preparation step, printed at the end of the run.
TIMINGS: dict[str, float] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        terminalreporter.write_line(
            "system tier: "
            + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in TIMINGS.items())
        )


@pytest.fixture(scope="session")
def system_available() -> None:
    """Skip the tier, with one reason, where it cannot run."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"system tier: {reason}")


def _build_wheelhouse(into: Path) -> None:
    """Wheels of this checkout and its dependencies, runtimed's engine the
    way scripts/build-engine builds it (its wheelhouse makes that quick
    after the first time; pip then takes it rather than building the
    default, native one). The checkout is copied first so that building
    leaves no build/ or egg-info in it."""
    engine = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build-engine"), "--wheelhouse", str(into)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=3600, check=False)
    if engine.returncode != 0:
        raise RuntimeError(f"scripts/build-engine failed: {engine.stderr.strip()[-2000:]}")
    source = into.parent / "source"
    source.mkdir()
    shutil.copy2(REPO / "pyproject.toml", source)
    if (REPO / "README.md").exists():
        shutil.copy2(REPO / "README.md", source)
    shutil.copytree(
        REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--wheel-dir",
            str(into),
            "--find-links",
            str(into),
            f"{source}[all]",  # every daemon's extra, as scripts/install installs
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"pip wheel of the checkout failed:\n{tail}")


@pytest.fixture(scope="session")
def wheelhouse(system_available: None) -> Iterator[Path]:
    """$SYNTROP_WHEELHOUSE when set (it must hold a syntrop wheel), else one
    built now from the checkout (pip's cache makes that quick)."""
    given = os.environ.get("SYNTROP_WHEELHOUSE")
    if given:
        yield Path(given)
        return
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}wheels-{os.getpid()}-") as scratch:
        wheels = Path(scratch) / "wheels"
        wheels.mkdir()
        started = time.monotonic()
        _build_wheelhouse(wheels)
        TIMINGS["wheelhouse"] = time.monotonic() - started
        yield wheels


@pytest.fixture(scope="session")
def instance(wheelhouse: Path) -> Iterator[Instance]:
    """A booted systemd with syntrop installed and syntrop-sockets.target up."""
    booted = Instance(REPO, wheelhouse, ttl=TTL)
    # SIGTERM (a CI timeout, `timeout`, kill) becomes a KeyboardInterrupt, so
    # that pytest tears the instance down instead of dying around it.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        booted.boot()
        TIMINGS["boot"] = booted.boot_seconds
        started = time.monotonic()
        booted.run(
            [str(REPO / "scripts" / "install"), "--wheelhouse", WHEELHOUSE_INSIDE], timeout=300
        )
        booted.install_seconds = TIMINGS["scripts/install"] = time.monotonic() - started
        booted.systemctl("start", "syntrop-sockets.target")
        yield booted
    finally:
        try:
            booted.close()
        finally:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def varlinkctl_bin() -> str:
    found = varlinkctl()
    if found is None:
        pytest.skip("varlinkctl not found (run scripts/fetch-varlinkctl or set $VARLINKCTL)")
    return found
