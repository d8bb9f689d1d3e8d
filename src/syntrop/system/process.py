"""Process identity and death: /proc/PID/stat start time and pidfds.

A pid alone is not an identity (pids are reused), so a process is recorded as
(pid, start time in clock ticks since boot); it is alive when /proc/PID/stat
still shows that start time.
"""

import asyncio
import os
import select
from collections.abc import Callable
from pathlib import Path

_READ_SIZE = 16384


def read_text(path: str | Path) -> str | None:
    """A small kernel file (/proc, /sys, cgroupfs) read with plain read(2)
    calls, or None when it cannot be read. Leases read two of these per
    grant: this costs a third of Path.read_text's buffered text layers."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:  # rare: a file longer than one read
            parts = [data]
            while chunk := os.read(fd, _READ_SIZE):
                parts.append(chunk)
            data = b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode(errors="replace")


def start_time(pid: int, *, proc: Path = Path("/proc")) -> int | None:
    """Field 22 of /proc/PID/stat, or None when there is no such process."""
    text = read_text(f"{proc}/{pid}/stat")
    if text is None:
        return None
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state), so field 22 is fields[19].
    return int(fields[19])


class StartTimes:
    """`start_time` of the processes asked about again and again (a client
    that leases per request), remembered with a pidfd of each: while the
    pidfd is not readable the process has not exited, so its pid is still
    its own and the start time read once still holds. One poll(2) instead
    of open, read, close and a parse of /proc/PID/stat. The `keep` most
    recently asked are remembered."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._known: dict[int, tuple[int, int, select.poll]] = {}

    def get(self, pid: int) -> int | None:
        known = self._known.pop(pid, None)
        if known is not None:
            if not known[2].poll(0):
                self._known[pid] = known  # the most recently asked last
                return known[1]
            os.close(known[0])  # exited: perhaps another process has the pid now
        fd = pidfd(pid)
        if fd is None:
            # No such process, or no pidfd for it (a thread's id, a kernel
            # or sandbox without pidfd_open): asked of /proc, not remembered.
            return start_time(pid)
        # The pidfd first, then the start time, then the pidfd once more:
        # a start time read while the pidfd's process still ran is its own.
        started = start_time(pid)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if started is None or poller.poll(0):  # gone, or exited meanwhile
            os.close(fd)
            return None if started is None else start_time(pid)
        self._known[pid] = (fd, started, poller)
        while len(self._known) > self.keep:
            oldest = next(iter(self._known))
            os.close(self._known.pop(oldest)[0])
        return started

    def close(self) -> None:
        for fd, _, _ in self._known.values():
            os.close(fd)
        self._known.clear()


def parent(pid: int, *, proc: Path = Path("/proc")) -> int | None:
    """Field 4 of /proc/PID/stat (the parent pid), or None."""
    text = read_text(f"{proc}/{pid}/stat")
    if text is None:
        return None
    return int(text.rsplit(")", 1)[1].split()[1])


def descends_from(pid: int, ancestor: int, *, proc: Path = Path("/proc"),
                  max_depth: int = 64) -> bool:
    """Whether `pid` is `ancestor` or below it in the process tree."""
    current: int | None = pid
    for _ in range(max_depth):
        if current == ancestor:
            return True
        if current is None or current <= 1:
            return False
        current = parent(current, proc=proc)
    return False


def alive(pid: int, started: int | None, *, proc: Path = Path("/proc")) -> bool:
    current = start_time(pid, proc=proc)
    if current is None:
        return False
    return started is None or current == started


def pidfd(pid: int) -> int | None:
    """A pidfd (readable when the process exits), or None if it is gone."""
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None


def watch_exit(pid: int, on_exit: Callable[[], None],
               loop: asyncio.AbstractEventLoop | None = None) -> Callable[[], None] | None:
    """Call `on_exit` once, in `loop` (default: the running one), when
    process `pid` exits, through a pidfd (no polling, no SIGCHLD). Returns
    the function that stops watching, or None when there is no such
    process already."""
    fd = pidfd(pid)
    if fd is None:
        return None
    watching = loop or asyncio.get_running_loop()
    open_ = True

    def stop() -> None:
        nonlocal open_
        if open_:
            open_ = False
            watching.remove_reader(fd)
            os.close(fd)

    def exited() -> None:
        stop()
        on_exit()

    watching.add_reader(fd, exited)
    return stop


def rss_bytes(pid: int | str = "self", *, proc: Path = Path("/proc")) -> int:
    """Resident memory of a process (VmRSS), in bytes; 0 when unreadable."""
    try:
        with open(proc / str(pid) / "status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
