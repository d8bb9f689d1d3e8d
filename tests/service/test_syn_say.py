"""`syn say` through a real PipeWire: a private server (pipewire and
wireplumber, its session manager, on a private bus) whose one sink is a
null sink; what syn plays into it is recorded from its monitor
(pw-record). Skipped where PipeWire, the synthesizer or the voice is not
installed (scripts/apt-deps installs PipeWire)."""

import importlib.util
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from syntrop import packaged
from tests.service.runtimed_node import Node, started

pytestmark = pytest.mark.service

TOOLS = ("pipewire", "wireplumber", "dbus-run-session", "pw-cat", "pw-record", "pw-cli")
if any(shutil.which(tool) is None for tool in TOOLS):
    pytest.skip("PipeWire is not installed (Debian: pipewire pipewire-bin wireplumber)",
                allow_module_level=True)
if importlib.util.find_spec("piper") is None or not packaged.installed(packaged.JOE):
    pytest.skip("the speech synthesizer or the packaged voice is not installed",
                allow_module_level=True)

SINK = "syn-null"
NULL_SINK = f"""context.objects = [
  {{ factory = adapter
    args = {{ factory.name = support.null-audio-sink node.name = "{SINK}"
             media.class = Audio/Sink audio.position = [ MONO ] audio.rate = 24000
             object.linger = true monitor.channel-volumes = true }} }}
]
"""


def _stop(process: "subprocess.Popen[bytes]") -> None:
    """End `process` and what it started (its own session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def pipewire(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A private PipeWire server with a null sink; yields its clients' environment."""
    runtime, config = tmp_path / "pw-run", tmp_path / "pw-config"
    runtime.mkdir(mode=0o700)
    (config / "pipewire" / "pipewire.conf.d").mkdir(parents=True)
    (config / "pipewire" / "pipewire.conf.d" / "null.conf").write_text(NULL_SINK)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "XDG_CONFIG_HOME": str(config)}
    env.pop("PIPEWIRE_REMOTE", None)
    log = open(tmp_path / "pipewire.log", "wb")  # noqa: SIM115 - the children's
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for argv in (["pipewire"], ["dbus-run-session", "--", "wireplumber"]):
            processes.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=log, start_new_session=True))
            deadline = time.monotonic() + 10
            while not (runtime / "pipewire-0").exists():
                assert time.monotonic() < deadline, "pipewire did not start"
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while SINK not in subprocess.run(["pw-cli", "ls", "Node"], env=env,
                                         capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "the null sink did not appear"
            time.sleep(0.1)
        time.sleep(1)  # wireplumber takes the sink as the default
        yield env
    finally:
        for process in reversed(processes):
            _stop(process)
        log.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    path = packaged.locate(packaged.JOE)
    assert path is not None
    with started(tmp_path / "node") as node:
        async def register() -> None:
            async with await node.modeld() as modeld:
                await modeld.Register(name="joe", path=str(path), sha256=packaged.JOE.sha256)
        node.run(register())
        yield node


def test_syn_say_plays_through_pipewire(pipewire: dict[str, str], node: Node,
                                        tmp_path: Path) -> None:
    recorded = tmp_path / "recorded.raw"
    recorder = subprocess.Popen(
        ["pw-record", "--target", SINK, "--rate", "24000", "--format", "s16", "--channels",
         "1", str(recorded)], env=pipewire, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(1)  # linked to the sink's monitor
        said = subprocess.run(
            [sys.executable, "-m", "syntrop.cli.syn", "say", "--out", str(tmp_path / "say.wav"),
             "The quick brown fox jumps over the lazy dog."],
            env={**pipewire, "RUNTIME_DIRECTORY": str(node.root / "run")},
            capture_output=True, text=True, timeout=120)
        assert said.returncode == 0, said.stderr
        assert said.stdout.startswith("played "), said.stdout
        assert not (tmp_path / "say.wav").exists()
        time.sleep(0.5)
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(10)
    data = recorded.read_bytes()
    samples = struct.unpack(f"<{len(data) // 2}h", data[:len(data) // 2 * 2])
    loud = sum(1 for s in samples if abs(s) > 300)
    assert loud > 24_000 // 2, f"{loud} loud samples of {len(samples)}"  # speech, not silence
    assert max(map(abs, samples)) > 2000
