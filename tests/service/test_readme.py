"""The README's walk-through, run as written: every ```sh block of README.md
in order, in one shell, from the repository root, in dev mode (`make run`
first), except blocks the README itself marks `<!-- readme: skip (why) -->`.

It runs with a fresh $HOME and $SYNTROP_DEV_DIR set inside it (the README
must work where a user moved the dev directory; the default one is the
launcher tests' business) in a private network namespace (so the README's
fixed port 32768 is ours, whatever else runs on this machine), and fails on
the first command that fails.
"""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(?:(<!-- readme: skip \((?P<why>[^)]+)\) -->)\n)?```sh\n(?P<body>.*?)```",
                   re.S)


def blocks(text: str) -> list[tuple[str, str | None]]:
    """(commands, why skipped or None) of every sh block."""
    return [(m["body"], m["why"]) for m in BLOCK.finditer(text)]


def test_every_block_is_run_or_skipped_with_a_reason() -> None:
    found = blocks((REPO / "README.md").read_text())
    assert (REPO / "README.md").read_text().count("```sh") == len(found)
    run = [body for body, why in found if why is None]
    assert run and run[0].lstrip().startswith("make run"), "the walk-through starts with make run"
    assert len(run) >= 4


def test_the_readme_walk_through_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2: scripts/apt-deps)")
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode != 0:
        pytest.skip("this kernel refuses a user and network namespace (unshare -rn)")
    if not (REPO / ".venv" / "bin" / "syn").exists():
        pytest.skip("no .venv: make builds it")
    runnable = [body for body, why in blocks((REPO / "README.md").read_text()) if why is None]
    script = tmp_path / "readme.sh"
    script.write_text(
        "set -euo pipefail\n"
        # The suite dies with the shell, whatever fails.
        "trap '.venv/bin/syn down >/dev/null 2>&1 || true' EXIT\n"
        + "".join(f"echo '### README block {index}'\n{body}\n"
                  for index, body in enumerate(runnable)))
    # Short: the dev sockets under it must fit a socket address (108 bytes).
    home = Path(tempfile.mkdtemp(prefix="readme-", dir="/tmp"))
    env = {key: value for key, value in os.environ.items()
           if key not in ("SYNTROP_DEV_DIR", "RUNTIME_DIRECTORY", "XDG_STATE_HOME",
                          "CONFIGURATION_DIRECTORY", "STATE_DIRECTORY", "CACHE_DIRECTORY",
                          "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["HOME"] = str(home)
    env["SYNTROP_DEV_DIR"] = str(home / "dev")
    result = subprocess.run(
        ["unshare", "-rn", "bash", "-c", f"ip link set lo up && exec bash {script}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    shutil.rmtree(home, ignore_errors=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"### README block {len(runnable) - 1}" in result.stdout
    assert "Traceback" not in output, output[-6000:]
    # What the model says is its business; that each step answered is ours.
    assert '"object": "chat.completion"' in result.stdout
    assert "OpenAI API: http://127.0.0.1:32768/v1" in result.stdout
    assert "io.syntrop.Inference1" in result.stdout
    assert "syntrop is down" in result.stdout
