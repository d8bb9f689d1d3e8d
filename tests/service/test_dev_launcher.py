"""`syn up` / `syn status` / `syn down`: socket activation without systemd."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import varlink

from syntrop.cli.launcher import DAEMONS


def syn(*args: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "syntrop.cli.syn", *args, "--dir", str(directory)],
        capture_output=True, text=True, timeout=60,
    )


def status(directory: Path) -> dict[str, dict[str, object]]:
    out = syn("status", "--json", directory=directory)
    return {row["daemon"]: row for row in json.loads(out.stdout)["daemons"]}


def test_up_binds_every_socket_and_spawns_on_first_connection(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    up = syn("up", "--idle-timeout", "1", directory=directory)
    assert up.returncode == 0, up.stderr
    try:
        before = status(directory)
        assert {d.program for d in DAEMONS} == set(before)
        assert all(row["state"] == "listening" and row["pid"] is None for row in before.values())
        for daemon in DAEMONS:
            assert (directory / "run" / daemon.interface).is_socket()

        address = f"unix:{directory}/run/io.syntrop.Model1"
        with varlink.Client(address=address) as client, client.open("org.varlink.service") as svc:
            info = svc.GetInfo()
        assert info["product"] == "modeld"
        assert "io.syntrop.Model1" in info["interfaces"]

        after = status(directory)
        assert after["modeld"]["state"] == "running"
        assert after["modeld"]["starts"] == 1
        # Only the daemon that was called was started.
        assert after["inferenced"]["state"] == "listening"
        assert (directory / "state" / "modeld").is_dir()

        # Idle exit, then the next connection starts it again.
        deadline = time.monotonic() + 10
        while status(directory)["modeld"]["pid"] is not None:
            assert time.monotonic() < deadline, "modeld did not exit when idle"
            time.sleep(0.1)
        with varlink.Client(address=address) as client, client.open("org.varlink.service") as svc:
            assert svc.GetInfo()["product"] == "modeld"
        assert status(directory)["modeld"]["starts"] == 2
        log = (directory / "log" / "modeld.log").read_text()
        assert "Traceback" not in log
    finally:
        down = syn("down", directory=directory)
    assert down.returncode == 0, down.stderr
    assert not (directory / "launcher.pid").exists()
    assert not any((directory / "run").iterdir())
    assert syn("status", directory=directory).returncode == 3


def test_up_twice_is_harmless_and_down_when_down_is_clear(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    assert syn("down", directory=directory).stdout.startswith("syntrop is not up")
    assert syn("up", directory=directory).returncode == 0
    try:
        second = syn("up", directory=directory)
        assert second.returncode == 0 and "already up" in second.stdout
        pid = int((directory / "launcher.pid").read_text())
        os.kill(pid, 0)
    finally:
        assert syn("down", directory=directory).returncode == 0


def test_status_shows_a_crashed_engine_worker_and_a_crashed_daemon(tmp_path: Path) -> None:
    """An engine worker killed by SIGSEGV shows as failed with its signal
    (runtimed itself still runs); so does a daemon killed by one."""
    import asyncio
    import importlib.util
    import signal

    import pytest

    from syntrop.interfaces.model import Model1
    from syntrop.interfaces.runtime import Runtime1
    from syntrop.varlink.client import connect
    from tests.models import SMOLLM2_SHA256, smollm2

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable")
    directory = tmp_path / "dev"
    assert syn("up", directory=directory).returncode == 0
    try:
        async def load() -> None:
            run = directory / "run"
            async with await connect(Model1, address=run / Model1.name, timeout=60) as modeld:
                await modeld.Register(name="smollm2", path=str(smollm2()), sha256=SMOLLM2_SHA256)
            async with await connect(Runtime1, address=run / Runtime1.name, timeout=60) as rt:
                async for _ in rt.Complete(model="smollm2", prompt="Hi", sampling=None):
                    pass

        asyncio.run(load())
        shown = json.loads(syn("status", "--json", directory=directory).stdout)
        worker = shown["engine"]["workers"][0]
        assert worker["model"] == "smollm2" and worker["state"] == "running"
        os.kill(worker["pid"], signal.SIGSEGV)
        deadline = time.monotonic() + 10
        while (shown := json.loads(syn("status", "--json", directory=directory).stdout)
               )["engine"]["workers"][0]["state"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        worker = shown["engine"]["workers"][0]
        assert worker["state"] == "crashed" and worker["last_signal"] == 11
        table = syn("status", directory=directory).stdout
        assert "failed (crashed)" in table and "killed by signal 11 (SIGSEGV)" in table
        runtimed = next(r for r in shown["daemons"] if r["daemon"] == "runtimed")
        os.kill(runtimed["pid"], signal.SIGSEGV)
        while status(directory)["runtimed"]["pid"] is not None:
            assert time.monotonic() < deadline + 10
            time.sleep(0.1)
        row = status(directory)["runtimed"]
        assert row["state"] == "failed" and row["last_exit"] == -11
        assert "signal 11 (SIGSEGV)" in syn("status", directory=directory).stdout
    finally:
        assert syn("down", directory=directory).returncode == 0
