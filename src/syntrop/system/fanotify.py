"""fanotify, to learn which process wrote a file (root only).

inotify says that a file changed; fanotify, in its classic mode (an open
descriptor per event), also says who: each FAN_CLOSE_WRITE event carries the
writer's pid. Marks are set on directories with FAN_EVENT_ON_CHILD, the way
inotify watches them, so only watched directories cost anything.

fanotify_init() in this mode needs CAP_SYS_ADMIN; `Fanotify.open()` raises
PermissionError without it, and callers carry on with inotify alone.
"""

import ctypes
import os
import struct
from dataclasses import dataclass

FAN_CLOEXEC = 0x00000001
FAN_NONBLOCK = 0x00000002
FAN_CLASS_NOTIF = 0x00000000
FAN_MARK_ADD = 0x00000001
FAN_MARK_REMOVE = 0x00000002
FAN_CLOSE_WRITE = 0x00000008
FAN_EVENT_ON_CHILD = 0x08000000
FAN_Q_OVERFLOW = 0x00004000
FAN_NOFD = -1
AT_FDCWD = -100

_METADATA = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
_READ_SIZE = 64 * 1024


@dataclass(frozen=True, slots=True)
class Write:
    """A file closed after writing: its path, the writer's pid and name."""

    path: str
    pid: int
    comm: str | None


def _libc() -> ctypes.CDLL:
    # The process's own symbols include libc's; no ldconfig lookup needed.
    return ctypes.CDLL(None, use_errno=True)


def comm_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as file:
            return file.read().strip() or None
    except OSError:
        return None


class Fanotify:
    """A notification-class fanotify group reporting FAN_CLOSE_WRITE."""

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self.fd = fd
        self._libc = libc
        self.own_pid = os.getpid()
        self._comms: dict[int, str | None] = {}

    @classmethod
    def open(cls) -> "Fanotify":
        libc = _libc()
        init = libc.fanotify_init
        init.argtypes = [ctypes.c_uint, ctypes.c_uint]
        init.restype = ctypes.c_int
        fd = init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK,
                  os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_LARGEFILE)
        if fd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
        return cls(fd, libc)

    def mark(self, directory: str) -> bool:
        """Report writes to files directly in `directory`; False on failure."""
        mark = self._libc.fanotify_mark
        mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int,
                         ctypes.c_char_p]
        mark.restype = ctypes.c_int
        result = mark(self.fd, FAN_MARK_ADD, FAN_CLOSE_WRITE | FAN_EVENT_ON_CHILD, AT_FDCWD,
                      os.fsencode(directory))
        return bool(result == 0)

    def read(self) -> list[Write]:
        """Every write queued now (not our own); [] when there is none."""
        writes: list[Write] = []
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return writes
            except InterruptedError:
                continue
            if not data:
                return writes
            offset = 0
            while offset + _METADATA.size <= len(data):
                length, _, _, _, mask, fd, pid = _METADATA.unpack_from(data, offset)
                if length < _METADATA.size:
                    break
                offset += length
                if fd < 0:
                    continue
                try:
                    path = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    path = ""
                finally:
                    os.close(fd)
                if path and pid != self.own_pid and mask & FAN_CLOSE_WRITE:
                    writes.append(Write(path, pid, self._comm(pid)))
            # A pid is reused only after its process is gone: names are
            # cached for one read, so a writer of many files costs one lookup.
            self._comms.clear()

    def _comm(self, pid: int) -> str | None:
        if pid not in self._comms:
            self._comms[pid] = comm_of(pid)
        return self._comms[pid]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
