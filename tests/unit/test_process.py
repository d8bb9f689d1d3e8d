"""system/process.py: a process's exit, seen through its pidfd."""

import asyncio
import os
import subprocess
import threading
from pathlib import Path

import pytest

from syntrop.system import process


def test_an_exit_is_seen_once_and_a_gone_process_is_not_watched() -> None:
    async def main() -> list[int]:
        seen: list[int] = []
        exited = asyncio.Event()
        child = subprocess.Popen(["sleep", "0.1"])

        def on_exit() -> None:
            seen.append(child.pid)
            exited.set()

        stop = process.watch_exit(child.pid, on_exit)
        assert stop is not None
        await asyncio.wait_for(exited.wait(), 10)
        stop()  # stopping after the exit is harmless
        child.wait()
        await asyncio.sleep(0.05)
        # Gone and reaped: nothing to watch.
        assert process.watch_exit(child.pid, on_exit) is None
        # Stopped before the exit: no call, and its pidfd is closed.
        other = subprocess.Popen(["sleep", "0.1"])
        fds = len(os.listdir("/proc/self/fd"))
        stop_other = process.watch_exit(other.pid, on_exit)
        assert stop_other is not None
        stop_other()
        assert len(os.listdir("/proc/self/fd")) == fds
        other.wait()
        await asyncio.sleep(0.05)
        return seen

    seen = asyncio.run(main())
    assert len(seen) == 1


def test_start_times_are_remembered_while_the_process_runs_and_not_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    times = process.StartTimes(keep=2)
    child = subprocess.Popen(["sleep", "30"])
    others = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    try:
        started = process.start_time(child.pid)
        assert started is not None
        assert times.get(child.pid) == started
        read = process.start_time
        reads: list[int] = []

        def counted(pid: int, **kw: Path) -> int | None:
            reads.append(pid)
            return read(pid, **kw)

        monkeypatch.setattr(process, "start_time", counted)
        assert times.get(child.pid) == started  # remembered: a poll, no /proc read
        assert reads == []
        monkeypatch.setattr(process, "start_time", read)
        child.kill()
        child.wait()
        assert times.get(child.pid) is None  # exited and reaped: asked anew
        assert child.pid not in times._known
        fds = len(os.listdir("/proc/self/fd"))
        for other in others:  # more than `keep`: the oldest is let go, its pidfd closed
            assert times.get(other.pid) == process.start_time(other.pid)
        assert list(times._known) == [o.pid for o in others]
        assert len(os.listdir("/proc/self/fd")) == fds + 2
        assert times.get(os.getpid()) == process.start_time(os.getpid())
        assert list(times._known) == [others[1].pid, os.getpid()]
        assert len(os.listdir("/proc/self/fd")) == fds + 2
        times.close()
        assert len(os.listdir("/proc/self/fd")) == fds
    finally:
        for other in [child, *others]:
            other.kill()
            other.wait()


def test_a_zombie_is_not_remembered() -> None:
    times = process.StartTimes()
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie now, not reaped
    try:
        assert times.get(child.pid) == process.start_time(child.pid)  # still in /proc
        assert child.pid not in times._known  # but exited: a later pid may be another's
    finally:
        child.wait()


def test_an_id_without_a_pidfd_is_asked_of_proc_each_time() -> None:
    """A thread's id has a /proc entry but no pidfd (EINVAL): its start
    time comes from /proc, as before, and is not remembered."""
    times = process.StartTimes()
    ready, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def thread() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    worker = threading.Thread(target=thread)
    worker.start()
    try:
        ready.wait(10)
        assert tid[0] != os.getpid()
        assert times.get(tid[0]) == process.start_time(tid[0]) is not None
        assert tid[0] not in times._known
    finally:
        done.set()
        worker.join()
