"""Files the way a content-addressed store needs them.

- Anonymous files (O_TMPFILE) that become visible only when linked into
  place, after their bytes were verified. Python 3.11's os.link() ignores
  follow_symlinks on Linux (it calls link(2), which does not follow the
  /proc/self/fd magic link), so `link_anonymous` calls linkat(2) with
  AT_SYMLINK_FOLLOW through os.link's dir-fd form.
- Copies that share blocks where the filesystem can (FICLONE: XFS, btrfs,
  bcachefs), else in the kernel (copy_file_range), else through user space.
- Free space of a filesystem, and fsync of a directory after a link or rename.
- Shared/exclusive flock(2) probes: a flock belongs to an open file
  description, so a descriptor passed to another process (SCM_RIGHTS) keeps
  its lock until the last copy of it is closed.
"""

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Literal

#: ioctl FICLONE: _IOW(0x94, 9, int).
FICLONE = 0x40049409

CopyMethod = Literal["reflink", "copy_file_range", "copy"]

#: Errors meaning "this filesystem or kernel cannot do that here", after which
#: the next, more general method is tried.
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                errno.EBADF, errno.EPERM}


def open_anonymous(directory: Path, mode: int = 0o444) -> int | None:
    """An unnamed file on the filesystem of `directory`, open O_RDWR, or None
    where O_TMPFILE is not supported (old kernels, some filesystems)."""
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, mode)
    except OSError as error:
        if error.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


def link_anonymous(fd: int, path: Path) -> None:
    """Give the anonymous file `fd` the name `path`, atomically. Raises
    FileExistsError when `path` exists (it is never replaced)."""
    proc = os.open("/proc/self/fd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def clone_or_copy(source: int, target: int, size: int) -> CopyMethod:
    """Make `target` (empty, open for writing) a copy of `source` (`size`
    bytes when it was looked at): shared blocks where possible, else an
    in-kernel copy, else a copy through user space. Returns the method that
    worked. The caller hashes what `target` holds, never `source`, so a
    source changed meanwhile cannot smuggle in unverified bytes."""
    try:
        fcntl.ioctl(target, FICLONE, source)
    except OSError as error:
        if error.errno not in _UNSUPPORTED:
            raise
    else:
        return "reflink"
    try:
        _copy_range(source, target, size)
        return "copy_file_range"
    except OSError as error:
        if error.errno not in _UNSUPPORTED:
            raise
    os.ftruncate(target, 0)
    _copy_user(source, target, size)
    return "copy"


def _copy_range(source: int, target: int, size: int) -> None:
    offset = 0
    while offset < size:
        copied = os.copy_file_range(source, target, size - offset, offset, offset)
        if copied == 0:
            raise EOFError(f"source ended after {offset} of {size} bytes")
        offset += copied


def _copy_user(source: int, target: int, size: int) -> None:
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    offset = 0
    while offset < size:
        count = os.preadv(source, [view[: min(len(buffer), size - offset)]], offset)
        if count == 0:
            raise EOFError(f"source ended after {offset} of {size} bytes")
        write_all(target, view[:count], offset)
        offset += count


def write_all(fd: int, data: memoryview | bytes, offset: int | None = None) -> None:
    """Write all of `data` (at `offset`, or at the file position)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[written:]
        if offset is not None:
            offset += written


_SYNC_FILE_RANGE_WRITE = 2
_libc: object | None = None


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Start writing [offset, offset+length) of `fd` to disk without waiting
    (sync_file_range(SYNC_FILE_RANGE_WRITE)), so a later fsync finds little
    left to do. Not a durability guarantee; best effort (False when the call
    is unavailable)."""
    global _libc
    import ctypes

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(_libc, "sync_file_range", None)
    if function is None:
        return False
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return bool(function(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of `path`."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fsync_directory(path: Path) -> None:
    """Make a link, rename or unlink in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_shared(fd: int) -> None:
    """Mark `fd`'s open file description as a reader (see `held_elsewhere`)."""
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)


def held_elsewhere(path: Path) -> bool:
    """Whether some open file description of `path` holds a flock: tried with
    a fresh description, so our own locks on other descriptions count too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops our probe lock
    return False


def try_lock_exclusive(fd: int) -> bool:
    """Take an exclusive flock on `fd` if nobody holds one; False otherwise."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
