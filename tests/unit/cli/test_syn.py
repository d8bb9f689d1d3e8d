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
