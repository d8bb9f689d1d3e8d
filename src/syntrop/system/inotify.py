"""inotify, non-blocking, for an event loop: the three system calls through
ctypes and the kernel's event records unpacked with struct.

`Inotify.read()` never blocks: it returns what the kernel has queued, or
nothing. The descriptor is for `loop.add_reader()`.

DESIGN.md named inotify-simple for this. It is not used: importing it
imports ctypes.util (shutil, tempfile, random, bz2, lzma), and opening an
instance runs find_library("c"), which starts `ldconfig -p` as a child
process: about 12 ms of contextd's CPU and 30 ms of a child's on every cold
start, for three calls that libc, already mapped into every process,
answers by name (docs/ARCHITECTURE.md).
"""

import contextlib
import ctypes
import os
import struct
from dataclasses import dataclass

ACCESS = 0x00000001
MODIFY = 0x00000002
ATTRIB = 0x00000004
CLOSE_WRITE = 0x00000008
MOVED_FROM = 0x00000040
MOVED_TO = 0x00000080
CREATE = 0x00000100
DELETE = 0x00000200
DELETE_SELF = 0x00000400
MOVE_SELF = 0x00000800
UNMOUNT = 0x00002000
Q_OVERFLOW = 0x00004000
IGNORED = 0x00008000
ONLYDIR = 0x01000000
DONT_FOLLOW = 0x02000000
EXCL_UNLINK = 0x04000000
ISDIR = 0x40000000

_READ_SIZE = 256 * 1024


@dataclass(frozen=True, slots=True)
class RawEvent:
    """One inotify event: watch descriptor, mask, rename cookie, name in the
    watched directory ('' for the directory itself)."""

    wd: int
    mask: int
    cookie: int
    name: str


_EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


def _check(result: int) -> int:
    if result == -1:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def parse(data: bytes) -> list[RawEvent]:
    """The events in what one read(2) of an inotify descriptor returned."""
    events = []
    position, size, end = 0, _EVENT.size, len(data)
    while position + size <= end:
        wd, mask, cookie, length = _EVENT.unpack_from(data, position)
        position += size
        name = data[position:position + length].split(b"\0", 1)[0]
        position += length
        events.append(RawEvent(wd, mask, cookie, os.fsdecode(name)))
    return events


class Inotify:
    """An inotify instance opened non-blocking and close-on-exec."""

    def __init__(self) -> None:
        # The process's own symbols include libc's: no library lookup.
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd: int = _check(self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))

    def add_watch(self, path: str, mask: int) -> int:
        """Watch `path`; its watch descriptor. Raises OSError (ENOENT,
        ENOTDIR with ONLYDIR, ENOSPC past max_user_watches, EACCES)."""
        while True:
            try:
                return _check(self._libc.inotify_add_watch(
                    self.fd, os.fsencode(path), ctypes.c_uint32(mask)))
            except InterruptedError:
                continue

    def rm_watch(self, wd: int) -> None:
        """Stop watching; a descriptor the kernel already dropped is ignored."""
        with contextlib.suppress(OSError):
            _check(self._libc.inotify_rm_watch(self.fd, wd))

    def read(self) -> list[RawEvent]:
        """Every event queued now; [] when there is none."""
        events: list[RawEvent] = []
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return events
            except InterruptedError:
                continue
            if not data:
                return events
            events.extend(parse(data))
            if len(data) < _READ_SIZE // 2:
                return events

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
