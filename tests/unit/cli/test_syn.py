"""syn's own behaviour at the edges: a closed pipe, --version."""

import os
import subprocess
import sys
from pathlib import Path


def test_a_reader_that_left_gets_no_traceback(tmp_path: Path) -> None:
    """`syn status --json | head`: stdout is a pipe nobody reads any more."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "syntrop.cli.syn", "status", "--json", "--dir",
             str(tmp_path)], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr == ""
    assert result.returncode == 141


def test_version() -> None:
    result = subprocess.run([sys.executable, "-m", "syntrop.cli.syn", "--version"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("syn ")


def test_logs_merge_the_daemons_by_time_and_keep_tracebacks_whole(tmp_path: Path) -> None:
    logs = tmp_path / "log"
    logs.mkdir()
    (logs / "modeld.log").write_text(
        "2026-12-02 01:00:00.100 modeld: INFO a: first\n"
        "2026-12-02 01:00:00.300 modeld: ERROR a: broke\nTraceback (most recent call last):\n"
        "  File \"x\", line 1\n")
    (logs / "routerd.log").write_text("2026-12-02 01:00:00.200 routerd: INFO b: second\n")

    def syn(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "syntrop.cli.syn", "logs", *args,
                               "--dir", str(tmp_path)], capture_output=True, text=True,
                              timeout=60)

    merged = syn().stdout.splitlines()
    assert [line.split()[2] for line in merged if line[:4].isdigit()] == \
        ["modeld:", "routerd:", "modeld:"]
    assert merged[-2:] == ["Traceback (most recent call last):", '  File "x", line 1']
    assert syn("routerd").stdout.count("\n") == 1
    assert syn("-n", "1").stdout.startswith("2026-12-02 01:00:00.300 modeld: ERROR")
    bad = syn("nosuchd")
    assert bad.returncode == 1 and bad.stderr.startswith("syn: no daemon 'nosuchd'")
