"""Getting bytes into the store, verified before they get a final name.

Two ways in:

- `import_file`: a local file (a path modeld may read, or a descriptor the
  caller passed). The bytes are reflinked (FICLONE) or copied in the kernel
  (copy_file_range) into an anonymous O_TMPFILE file on the store's
  filesystem, then hashed there — the copy, not the source, so a source
  changed meanwhile cannot slip unverified bytes in — and linked into place
  by the caller only if the digest is right. Where O_TMPFILE is missing, a
  named file under partial/ plays its part and is renamed after verification.

- `Receiver`: a pull, whose bytes arrive through a pipe from the client that
  fetches them (modeld has no network). They are hashed as they arrive and
  appended to partial/<digest>, a named file because it must outlive a crash
  of modeld or of the client: the journal (in SQLite, written by the caller)
  records how many of its bytes were fsync'd, and a later pull of the same
  digest resumes there after re-hashing them. The digest is checked when the
  stream ends; only then is the partial moved under blobs/.

Every blocking call here runs in a worker thread (the service's to_thread);
a Receiver is used by one thread at a time, guarded by its lock.
"""

import contextlib
import fcntl
import os
import select
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from syntrop.modeld.blobs import BlobTree
from syntrop.system import files

if TYPE_CHECKING:
    import hashlib

CHUNK = 1 << 20
#: Start writeback every this many bytes, so the fsync before the blob is
#: linked has little left to wait for.
WRITEBACK = 8 << 20
#: Make received bytes durable (fdatasync + journal) after the stream has
#: been idle this long, and at least this often while it flows.
IDLE_CHECKPOINT = 0.25
CHECKPOINT_INTERVAL = 5.0


class StagingError(Exception):
    pass


class Incomplete(StagingError):
    """The stream ended before the announced size; the partial is kept."""

    def __init__(self, received: int, expected: int) -> None:
        super().__init__(f"the stream ended after {received} of {expected} bytes")
        self.received = received
        self.expected = expected


class Oversized(StagingError):
    """More bytes than announced arrived; the partial is discarded."""


class Mismatch(StagingError):
    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"expected sha256 {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class Busy(StagingError):
    """Another process holds this partial."""


def hash_fd(fd: int, start: int = 0, end: int | None = None,
            digest: "hashlib._Hash | None" = None) -> "hashlib._Hash":
    """Hash bytes [start, end) of `fd` (to EOF when end is None) with pread."""
    import hashlib  # here, not at start-up: it maps libcrypto (see system/digest.py)

    digest = digest or hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    offset = start
    while end is None or offset < end:
        want = CHUNK if end is None else min(CHUNK, end - offset)
        count = os.preadv(fd, [view[:want]], offset)
        if count == 0:
            if end is not None:
                raise EOFError(f"file ended at {offset}, expected {end}")
            break
        digest.update(view[:count])
        offset += count
    return digest


@dataclass(slots=True)
class Staged:
    """An imported file, hashed, not yet linked."""

    fd: int
    #: Set when O_TMPFILE was unavailable and a named file under partial/ was used.
    path: Path | None
    digest: str
    size: int
    method: str

    def link(self, tree: BlobTree) -> bool:
        """Give the verified bytes their final name; False if already stored."""
        os.fsync(self.fd)
        if self.path is None:
            return tree.link_anonymous(self.fd, self.digest)
        linked = tree.adopt(self.path, self.digest)
        self.path = None
        return linked

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.path is not None:
            files.unlink_quietly(self.path)
            self.path = None


def import_file(source: int, tree: BlobTree) -> Staged:
    """Copy (reflink where possible) the regular file open at `source` into
    the store's filesystem and hash the copy."""
    size = os.fstat(source).st_size
    path = None
    fd = files.open_anonymous(tree.blobs)
    if fd is None:
        path = tree.partials / f"import-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    staged = Staged(fd=fd, path=path, digest="", size=0, method="")
    try:
        staged.method = files.clone_or_copy(source, fd, size)
        staged.size = os.fstat(fd).st_size
        if staged.method != "reflink":
            # The disk writes the copy while we hash it; the fsync before
            # the link then has little left to wait for.
            files.start_writeback(fd, 0, staged.size)
        staged.digest = hash_fd(fd).hexdigest()
    except BaseException:
        staged.close()
        raise
    return staged


class Receiver:
    """One pull's bytes, from a pipe into partial/<digest>."""

    def __init__(self, path: Path, *, digest: str, size: int | None,
                 durable: int, restart: bool) -> None:
        self.path = path
        self.digest = digest
        self.size = size
        self.lock = threading.Lock()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if not files.try_lock_exclusive(self.fd):
            os.close(self.fd)
            raise Busy(f"{path} is being written by another process")
        present = os.fstat(self.fd).st_size
        offset = 0 if restart else min(durable, present)
        if size is not None and offset > size:
            offset = 0
        # Bytes past the journaled point may be garbage after a power loss:
        # drop them and fetch them again.
        os.ftruncate(self.fd, offset)
        self.offset = offset
        self.durable = offset
        self.resumed = offset
        import hashlib

        self.hash = hashlib.sha256()
        self.source = -1
        self.last_sync = self.last_data = time.monotonic()
        self.buffer = memoryview(bytearray(CHUNK))
        self.written_back = offset
        self.closed = False

    def prepare(self, source: int) -> None:
        """Hash the bytes kept from earlier pulls; take our own copy of the
        pipe (the caller's copy may be closed before we are done)."""
        with self.lock:
            if self.offset:
                hash_fd(self.fd, 0, self.offset, self.hash)
            self.source = os.dup(source)
            os.set_blocking(self.source, False)

    def pump(self, deadline: float) -> bool:
        """Move bytes from the pipe until `deadline` (monotonic) or the end of
        the stream; True at the end. Checkpoints when the pipe is idle."""
        with self.lock:
            view = self.buffer
            poller = select.poll()
            poller.register(self.source, select.POLLIN)
            while True:
                now = time.monotonic()
                if now >= deadline:
                    return False
                wait = min(deadline - now, IDLE_CHECKPOINT)
                if not poller.poll(max(1, int(wait * 1000))):
                    idle = time.monotonic() - self.last_data
                    if self.offset > self.durable and idle >= IDLE_CHECKPOINT:
                        self._sync()
                    continue
                try:
                    count = os.readv(self.source, [view])
                except BlockingIOError:
                    continue
                if count == 0:
                    return True
                if self.size is not None and self.offset + count > self.size:
                    raise Oversized(f"more than the announced {self.size} bytes arrived")
                self.hash.update(view[:count])
                files.write_all(self.fd, view[:count], self.offset)
                self.offset += count
                self.last_data = now
                if self.offset - self.written_back >= WRITEBACK:
                    files.start_writeback(self.fd, self.written_back,
                                          self.offset - self.written_back)
                    self.written_back = self.offset
                if now - self.last_sync >= CHECKPOINT_INTERVAL:
                    self._sync()

    def _sync(self) -> None:
        os.fdatasync(self.fd)
        self.durable = self.offset
        self.last_sync = time.monotonic()

    def finish(self) -> None:
        """After the end of the stream: complete and right, or an error."""
        with self.lock:
            if self.size is not None and self.offset < self.size:
                self._sync()
                raise Incomplete(self.offset, self.size)
            actual = self.hash.hexdigest()
            if actual != self.digest:
                raise Mismatch(self.digest, actual)
            os.fsync(self.fd)
            self.durable = self.offset

    def checkpoint(self) -> int:
        """Make what arrived durable; the byte count to journal."""
        with self.lock:
            if not self.closed and self.offset > self.durable:
                self._sync()
            return self.durable

    def close(self, *, discard: bool = False) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if discard:
                files.unlink_quietly(self.path)
            if self.source >= 0:
                os.close(self.source)
            os.close(self.fd)  # releases the flock


def set_pipe_size(fd: int, size: int = CHUNK) -> None:
    """Grow a pipe's buffer (fewer wake-ups per MiB); best effort."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
