"""inotify, non-blocking, for an event loop: a thin typed face over
inotify-simple (the library DESIGN.md chose).

`Inotify.read()` never blocks: it returns what the kernel has queued, or
nothing. The descriptor is for `loop.add_reader()`.
"""

import contextlib
import os
from dataclasses import dataclass

import inotify_simple  # type: ignore[import-untyped]

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


class Inotify:
    """An inotify instance opened non-blocking and close-on-exec."""

    def __init__(self) -> None:
        self._inotify = inotify_simple.INotify(nonblocking=True)
        self.fd: int = int(self._inotify.fileno())

    def add_watch(self, path: str, mask: int) -> int:
        """Watch `path`; its watch descriptor. Raises OSError (ENOENT,
        ENOTDIR with ONLYDIR, ENOSPC past max_user_watches, EACCES)."""
        return int(self._inotify.add_watch(path, mask))

    def rm_watch(self, wd: int) -> None:
        """Stop watching; a descriptor the kernel already dropped is ignored."""
        with contextlib.suppress(OSError):
            self._inotify.rm_watch(wd)

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
            events.extend(
                RawEvent(int(e.wd), int(e.mask), int(e.cookie), str(e.name))
                for e in inotify_simple.parse_events(data)
            )
            if len(data) < _READ_SIZE // 2:
                return events

    def close(self) -> None:
        self._inotify.close()
