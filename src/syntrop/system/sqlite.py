"""The one SQLite helper: WAL, a busy timeout, schema versions, and a worker
thread so the event loop never waits on the disk.

synchronous=NORMAL in WAL mode: a committed transaction survives the process
being killed (kill -9, crash), which is what daemons that exit on idle need;
only a power loss can take the last transactions back.

Group commit (`batched`): work handed in while the worker thread is busy
committing waits for it, then all of it goes in one transaction (a savepoint
each, so one that fails is undone alone); every caller returns only once its
own work is committed. Under concurrency one COMMIT serves many callers;
alone, a caller pays what `run` costs.
"""

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class Database:
    """A connection used from one worker thread; `run()` awaits a function of
    the connection there. Every call is one transaction."""

    def __init__(self, path: Path, migrations: Sequence[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._lock = threading.Lock()
        self.connection = self._executor.submit(self._open, path, migrations).result()
        self._queue: list[tuple[Callable[[sqlite3.Connection], object],
                                asyncio.Future[object]]] = []
        self._flusher: asyncio.Task[None] | None = None
        #: Transactions `batched` committed, and the work they held (a
        #: benchmark's view of how much grouping happened).
        self.commits = self.grouped = 0

    @staticmethod
    def _open(path: Path, migrations: Sequence[str]) -> sqlite3.Connection:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA busy_timeout=5000")
        connection.execute("PRAGMA foreign_keys=ON")
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
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._queue.append((function, future))
        if self._flusher is None or self._flusher.done():
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
            for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)  # type: ignore[arg-type]

    def _group(self, functions: list[Callable[[sqlite3.Connection], object]]
               ) -> list[tuple[bool, object]]:
        outcomes: list[tuple[bool, object]] = []
        with self._lock:
            connection = self.connection
            connection.execute("BEGIN IMMEDIATE")
            try:
                for function in functions:
                    connection.execute("SAVEPOINT one")
                    try:
                        outcomes.append((True, function(connection)))
                    except Exception as error:
                        connection.execute("ROLLBACK TO one")
                        outcomes.append((False, error))
                    connection.execute("RELEASE one")
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            self.commits += 1
            self.grouped += len(functions)
        return outcomes

    def close(self) -> None:
        self._executor.submit(self.connection.close).result()
        self._executor.shutdown()
