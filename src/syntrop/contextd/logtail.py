"""Reading a log incrementally from a remembered offset, across rotation.

The position is (inode, offset, a digest of the file's first bytes). On the
next read:
- same inode, not shorter, same first bytes: go on from the offset;
- a new inode at the path (logrotate moved the old file away): finish the old
  file where it went (path.1, path-DATE; compressed ones cannot be, and are
  not, read), then read the new one from the start;
- same inode but shorter, or other first bytes (copytruncate, rewritten):
  read from the start.
Only complete records are consumed (`complete` says how many bytes are), so
a line or stanza half written is read next time.
"""

import glob
import os
from collections.abc import Callable
from dataclasses import dataclass

from syntrop.system.digest import sha256

_HEAD = 256


@dataclass(frozen=True, slots=True)
class Position:
    inode: int
    offset: int
    head: str


def _head(fd: int, length: int) -> str:
    return str(sha256(os.pread(fd, min(length, _HEAD), 0)).hexdigest())


def _rotated(path: str, inode: int) -> str | None:
    for candidate in [f"{path}.1", f"{path}.0", *sorted(glob.glob(glob.escape(path) + "-*"))]:
        if candidate.endswith((".gz", ".xz", ".bz2", ".zst")):
            continue
        try:
            if os.stat(candidate).st_ino == inode:
                return candidate
        except OSError:
            continue
    return None


def _read_from(path: str, offset: int, limit: int,
               complete: Callable[[bytes], int]) -> tuple[bytes, Position | None]:
    """Complete records of `path` from `offset` (at most `limit` bytes) and
    the position after them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b"", None
    try:
        st = os.fstat(fd)
        data = os.pread(fd, min(limit, max(0, st.st_size - offset)), offset)
        used = complete(data)
        end = offset + used
        return data[:used], Position(st.st_ino, end, _head(fd, end))
    finally:
        os.close(fd)


def read_new(path: str, position: Position | None, complete: Callable[[bytes], int], *,
             limit: int = 8 * 1024 * 1024) -> tuple[list[bytes], Position | None]:
    """What was appended to `path` since `position`; the new position
    (None while the file does not exist)."""
    chunks: list[bytes] = []
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if position is not None and (st is None or st.st_ino != position.inode):
        old = _rotated(path, position.inode)
        if old is not None:
            data, _ = _read_from(old, position.offset, limit, complete)
            chunks.append(data)
        position = None
    if st is None:
        return chunks, None
    offset = 0
    if position is not None:
        offset = position.offset
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                if st.st_size < offset or _head(fd, offset) != position.head:
                    offset = 0
            finally:
                os.close(fd)
        except OSError:
            return chunks, position
    data, new = _read_from(path, offset, limit, complete)
    chunks.append(data)
    return [chunk for chunk in chunks if chunk], new if new is not None else position


def lines_complete(data: bytes) -> int:
    """Bytes up to and including the last newline."""
    return data.rfind(b"\n") + 1
