"""inferenced's exit watches: a pidfd per leasing process, kept a while
after its last lease so a client that leases again and again does not open
one per lease, and the leases of a process released when it exits."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from syntrop.config import Paths
from syntrop.inferenced import service as svc
from syntrop.inferenced.service import InferenceService
from syntrop.varlink.peer import Peer, set_current


def _paths(root: Path) -> Paths:
    for name in ("run", "state", "cache", "config"):
        (root / name).mkdir()
    return Paths(runtime=root / "run", state=root / "state", cache=root / "cache",
                 configuration=root / "config")


async def _lease(service: InferenceService, pid: int) -> str:
    before = set(service.records)
    await service.AcquireLease(priority="Batch", memory_bytes=1 << 20, plane="cpu",
                               unit=None, pid=pid)
    (lease_id,) = set(service.records) - before
    return lease_id


def test_a_watch_outlives_the_lease_and_an_exit_releases(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    async def scenario() -> None:
        service = await InferenceService.open(_paths(tmp_path))
        set_current(Peer(pid=os.getpid(), uid=0, gid=0))
        try:
            await service.ReleaseLease(lease_id=await _lease(service, child.pid))
            kept = service.watches[child.pid]  # no lease, still watched
            lease_id = await _lease(service, child.pid)
            assert service.watches[child.pid] is kept  # the same pidfd, not a new one
            child.kill()
            child.wait()
            for _ in range(200):
                if lease_id not in service.records:
                    break
                await asyncio.sleep(0.01)
            assert lease_id not in service.records
            assert child.pid not in service.watches
        finally:
            await service.aclose()

    try:
        asyncio.run(scenario())
    finally:
        child.kill()
        child.wait()


def test_idle_watches_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                for _ in range(4)]
    monkeypatch.setattr(svc, "IDLE_WATCHES", 2)

    async def scenario() -> None:
        service = await InferenceService.open(_paths(tmp_path))
        set_current(Peer(pid=os.getpid(), uid=0, gid=0))
        try:
            for child in children:
                await service.ReleaseLease(lease_id=await _lease(service, child.pid))
            # The two most recently used are kept.
            assert list(service.watches) == [c.pid for c in children[-2:]]
        finally:
            await service.aclose()

    try:
        asyncio.run(scenario())
    finally:
        for child in children:
            child.kill()
            child.wait()
