"""The cgroup v2 freezer.

The v2 mount is found in /proc/self/mountinfo (never assumed at
/sys/fs/cgroup: hybrid hosts mount it at /sys/fs/cgroup/unified). A cgroup
is frozen by writing 1 to cgroup.freeze; the kernel reports completion
through the "frozen 1" line of cgroup.events, which is pollable (POLLPRI,
reported by epoll as EPOLLPRI) — so `freeze()` waits for the event instead of
sleeping.
"""

import os
import select
import time
from collections.abc import Iterator
from pathlib import Path

from syntrop.system.process import read_text


class CgroupError(Exception):
    """A cgroup operation failed; the message says which and why."""


def cgroup2_mount(mountinfo: str) -> Path | None:
    """The mount point of the cgroup2 filesystem in mountinfo text."""
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        if sep and after.split(" ", 1)[0] == "cgroup2":
            return Path(_unescape(before.split()[4]))
    return None


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def find_mount(*, proc: Path = Path("/proc")) -> Path | None:
    try:
        return cgroup2_mount((proc / "self" / "mountinfo").read_text())
    except OSError:
        return None


def cgroup_of_pid(pid: int, *, proc: Path = Path("/proc")) -> str | None:
    """The v2 cgroup path of a process ("/system.slice/x.service"), or None."""
    text = read_text(f"{proc}/{pid}/cgroup")
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def is_frozen(directory: Path) -> bool:
    try:
        events = (directory / "cgroup.events").read_text()
    except OSError as error:
        raise CgroupError(f"cannot read {directory}/cgroup.events: {error.strerror}") from None
    return "frozen 1" in events.splitlines()


def _wait_events(directory: Path, frozen: bool, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    fd = os.open(directory / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    try:
        poller = select.epoll()
        with poller:
            poller.register(fd, select.EPOLLPRI)
            while is_frozen(directory) != frozen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    state = "frozen" if frozen else "thawed"
                    raise CgroupError(f"{directory} not {state} within {timeout * 1000:.0f} ms")
                poller.poll(remaining)
    finally:
        os.close(fd)


def set_frozen(directory: Path, frozen: bool, *, timeout: float = 0.25) -> None:
    """Freeze or thaw a cgroup and wait until the kernel says it is done."""
    try:
        (directory / "cgroup.freeze").write_text("1" if frozen else "0")
    except OSError as error:
        raise CgroupError(
            f"cannot {'freeze' if frozen else 'thaw'} {directory}: {error.strerror}"
        ) from None
    _wait_events(directory, frozen, timeout)


def unit_cgroup(mount: Path, unit: str, *, max_depth: int = 4) -> str | None:
    """The cgroup of a systemd unit, found by its directory name under the v2
    mount (units sit in their slice: /system.slice/foo.service,
    /user.slice/user-1000.slice/...). Breadth-first, bounded depth."""
    level = [mount]
    for _ in range(max_depth):
        following: list[Path] = []
        for directory in level:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.name == unit:
                    return "/" + str(Path(entry.path).relative_to(mount))
                following.append(Path(entry.path))
        level = following
    return None


def pids(mount: Path, group: str) -> Iterator[int]:
    """The processes in cgroup `group` and every cgroup below it (those
    that exit meanwhile may still be listed)."""
    for directory, _, _ in os.walk(mount / group.lstrip("/")):
        text = read_text(f"{directory}/cgroup.procs")
        for line in (text or "").split():
            yield int(line)


def uids_in(mount: Path, group: str, *, proc: Path = Path("/proc")) -> set[int]:
    """The real and effective uids of the processes in cgroup `group` and
    below it."""
    found: set[int] = set()
    for pid in pids(mount, group):
        status = read_text(f"{proc}/{pid}/status") or ""
        for line in status.splitlines():
            if line.startswith("Uid:"):
                found.update(int(uid) for uid in line.split()[1:3])
                break
    return found


def contains(outer: str, inner: str) -> bool:
    """Whether cgroup `inner` is `outer` or below it."""
    outer = outer.rstrip("/") or "/"
    return outer == "/" or inner == outer or inner.startswith(outer + "/")


def make_child(mount: Path, parent: str, name: str) -> str:
    """Create cgroup `parent`/`name` (an existing one is reused); its path."""
    path = f"{parent.rstrip('/')}/{name}"
    try:
        (mount / path.lstrip("/")).mkdir(exist_ok=True)
    except OSError as error:
        raise CgroupError(f"cannot create cgroup {path}: {error.strerror}") from None
    return path


def move(mount: Path, cgroup: str, pid: int) -> None:
    """Move process `pid` (all its threads) into `cgroup`."""
    try:
        (mount / cgroup.lstrip("/") / "cgroup.procs").write_text(str(pid))
    except OSError as error:
        raise CgroupError(f"cannot move pid {pid} into {cgroup}: {error.strerror}") from None


def remove(mount: Path, cgroup: str) -> None:
    """Remove an empty cgroup; one still in use (EBUSY) or gone is left."""
    import contextlib

    with contextlib.suppress(OSError):
        (mount / cgroup.lstrip("/")).rmdir()
