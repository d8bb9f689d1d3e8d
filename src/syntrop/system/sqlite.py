"""The one SQLite helper: WAL, a busy timeout, schema versions, and a worker
thread so the event loop never waits on the disk.

synchronous=NORMAL in WAL mode: a committed transaction survives the process
being killed (kill -9, crash), which is what daemons that exit on idle need;
only a power loss can take the last transactions back.

Group commit (`batched`): work handed in while the worker thread is busy
committing waits for it, then all of it goes in one transaction (run again
with a savepoint each when one fails, so that it alone is undone); every
caller returns only once its own work is committed. Under concurrency one
COMMIT serves many callers; alone, a caller pays what `run` costs.

With `commit_on_loop` the group commit runs on the event loop's thread
instead, once per loop iteration: what every callback of one iteration
submitted is one transaction. Small transactions (inferenced's leases:
tens of microseconds to commit, no fsync in WAL mode) are then not paying
the two thread wake-ups of a hand-off, which cost more than the commit.
Once a commit held more than one caller's work (callers come
concurrently), the next waits one more iteration, so that the work of
callers answered by the last commit, arriving then, shares it
(inferenced's leases at 8 clients: 189 -> 160 µs of CPU a lease pair).
Work after a commit of one caller's work does not wait, so a lone caller
waits once at most, right after others went away. The fsync of
a checkpoint would stall the loop, so automatic checkpoints are off and a
second connection on the worker thread checkpoints every CHECKPOINT_EVERY
commits (PASSIVE: it never blocks a writer). A checkpoint that runs while
commits go on always leaves the frames written meanwhile, and SQLite
starts the WAL over only after one that left nothing: so the worker runs
a second, short one with the loop's commits held off, and the loop, finding
them held, commits a moment later instead of waiting. Without it the WAL
grew by every commit for as long as commits kept coming (20 MB/s under
bench_inferenced's 8 lease clients) and each commit cost more.
"""

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Loop-thread commits between two checkpoints (commit_on_loop).
CHECKPOINT_EVERY = 256
#: Seconds the loop waits to commit while the checkpoint's last step holds
#: commits off (commit_on_loop).
HELD_OFF_RETRY = 0.0005
#: Bytes the WAL file is cut back to when SQLite starts it over.
WAL_SIZE_LIMIT = 4 << 20


def _resolve(batch: "Sequence[tuple[object, asyncio.Future[object]]]",
             outcomes: list[tuple[bool, object]]) -> None:
    """Each caller's future, once its work is committed: its result, or
    the error that undid its savepoint."""
    for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)  # type: ignore[arg-type]


def _log_checkpoint_failure(done: "Future[None]") -> None:
    if done.cancelled():
        return
    error = done.exception()
    if error is not None:
        logger.warning("checkpoint of the WAL failed: %s", error)


class Database:
    """A connection used from one worker thread; `run()` awaits a function of
    the connection there. Every call is one transaction."""

    def __init__(self, path: Path, migrations: Sequence[str], *,
                 commit_on_loop: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.commit_on_loop = path, commit_on_loop
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._lock = threading.Lock()
        self.connection = self._executor.submit(self._open, path, migrations).result()
        self._queue: list[tuple[Callable[[sqlite3.Connection], object],
                                asyncio.Future[object]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._checkpointer: sqlite3.Connection | None = None
        self._checkpointing: Future[None] | None = None
        if commit_on_loop:
            self.sync(lambda c: None)  # the worker thread exists before the loop needs it
            self.connection.execute("PRAGMA wal_autocheckpoint=0")
        #: Transactions `batched` committed, and the work they held (a
        #: benchmark's view of how much grouping happened).
        self.commits = self.grouped = 0
        self._last_group = 0

    @staticmethod
    def _open(path: Path, migrations: Sequence[str]) -> sqlite3.Connection:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA busy_timeout=5000")
        connection.execute("PRAGMA foreign_keys=ON")
        connection.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        for number, script in enumerate(migrations[version:], start=version + 1):
            connection.execute("BEGIN IMMEDIATE")
            try:
                for statement in script.split(";"):
                    if statement.strip():
                        connection.execute(statement)
                connection.execute(f"PRAGMA user_version={number}")
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise
        return connection

    def _transaction(self, function: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            self.connection.execute("BEGIN IMMEDIATE")
            try:
                result = function(self.connection)
            except BaseException:
                self.connection.execute("ROLLBACK")
                raise
            self.connection.execute("COMMIT")
            return result

    def sync(self, function: Callable[[sqlite3.Connection], T]) -> T:
        """Run a transaction now, blocking (start-up and tests only)."""
        return self._executor.submit(self._transaction, function).result()

    async def run(self, function: Callable[[sqlite3.Connection], T]) -> T:
        """Run a transaction on the worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._transaction, function)

    async def batched(self, function: Callable[[sqlite3.Connection], T]) -> T:
        """Run `function` in the next group commit (see the module)."""
        return await self.submit(function)

    def submit(self, function: Callable[[sqlite3.Connection], T]) -> "asyncio.Future[T]":
        """Queue `function` for the next group commit now (work is committed
        in the order it is submitted); a future of its result, set once it
        is committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        self._queue.append((function, future))
        if self.commit_on_loop:
            if self._flush_handle is None:
                self._flush_handle = loop.call_soon(
                    self._flush_next if self._last_group > 1 else self._flush_on_loop)
        elif self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return future  # type: ignore[return-value]

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                outcomes = await loop.run_in_executor(
                    self._executor, self._group, [function for function, _ in batch])
            except BaseException as error:  # the COMMIT failed: none of it holds
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                if not isinstance(error, Exception):
                    raise
                continue
            _resolve(batch, outcomes)

    def _flush_next(self) -> None:
        """The commit one iteration later (see the module)."""
        self._flush_handle = asyncio.get_running_loop().call_soon(self._flush_on_loop)

    def _flush_on_loop(self, wait: bool = False) -> None:
        self._flush_handle = None
        if not self._lock.acquire(blocking=wait):
            # The checkpoint's last step (`_checkpoint`), or a transaction of
            # `run`/`sync` on the worker: a moment later, rather than the
            # loop waiting on their fsync.
            self._flush_handle = asyncio.get_running_loop().call_later(
                HELD_OFF_RETRY, self._flush_on_loop)
            return
        batch, self._queue = self._queue, []
        self._last_group = len(batch)
        try:
            outcomes = self._group_locked([function for function, _ in batch])
        except Exception as error:  # the COMMIT failed: none of it holds
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        finally:
            self._lock.release()
        _resolve(batch, outcomes)
        if self.commits % CHECKPOINT_EVERY == 0 and (
                self._checkpointing is None or self._checkpointing.done()):
            self._checkpointing = self._executor.submit(self._checkpoint)
            self._checkpointing.add_done_callback(_log_checkpoint_failure)

    def _checkpoint(self) -> None:
        """Copy the WAL into the database (the worker thread, its own
        connection, so the loop's commits go on meanwhile); then the frames
        committed meanwhile, with commits held off, so that the next commit
        starts the WAL over (see the module)."""
        if self._checkpointer is None:
            self._checkpointer = sqlite3.connect(self.path, isolation_level=None,
                                                 check_same_thread=False)
            self._checkpointer.execute("PRAGMA busy_timeout=5000")
        self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
        with self._lock:
            self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _group(self, functions: list[Callable[[sqlite3.Connection], object]]
               ) -> list[tuple[bool, object]]:
        """One transaction for all of `functions`. Optimistic: they run one
        after another with nothing between them; when one fails, the
        transaction is rolled back and run again with a savepoint around
        each, so that only the failing one is undone. A function may
        therefore run twice: it must touch nothing but the connection."""
        with self._lock:
            return self._group_locked(functions)

    def _group_locked(self, functions: list[Callable[[sqlite3.Connection], object]]
                      ) -> list[tuple[bool, object]]:
        """`_group`, its lock held by the caller."""
        connection = self.connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            try:
                outcomes: list[tuple[bool, object]] = [
                    (True, function(connection)) for function in functions]
            except Exception as error:
                connection.execute("ROLLBACK")
                if len(functions) == 1:
                    return [(False, error)]
                connection.execute("BEGIN IMMEDIATE")
                outcomes = self._each_in_a_savepoint(functions)
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        self.commits += 1
        self.grouped += len(functions)
        return outcomes

    def _each_in_a_savepoint(self, functions: list[Callable[[sqlite3.Connection], object]]
                             ) -> list[tuple[bool, object]]:
        connection = self.connection
        outcomes: list[tuple[bool, object]] = []
        for function in functions:
            connection.execute("SAVEPOINT one")
            try:
                outcomes.append((True, function(connection)))
            except Exception as error:
                connection.execute("ROLLBACK TO one")
                outcomes.append((False, error))
            connection.execute("RELEASE one")
        return outcomes

    def close(self) -> None:
        if self._flush_handle is not None:  # what was submitted is committed first
            self._flush_handle.cancel()
            self._flush_on_loop(wait=True)
        if self._checkpointing is not None:  # it may open the checkpointer yet
            with contextlib.suppress(Exception):
                self._checkpointing.result()
        if self._checkpointer is not None:
            checkpointer = self._checkpointer
            self._executor.submit(checkpointer.close).result()
        self._executor.submit(self.connection.close).result()
        self._executor.shutdown()
