"""system/process.py: a process's exit, seen through its pidfd."""

import asyncio
import os
import subprocess

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
