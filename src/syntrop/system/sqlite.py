"""The one SQLite helper: WAL, a busy timeout, schema versions, and a worker
thread so the event loop never waits on the disk.

synchronous=NORMAL in WAL mode: a committed transaction survives the process
being killed (kill -9, crash), which is what daemons that exit on idle need;
only a power loss can take the last transactions back.
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

    def close(self) -> None:
        self._executor.submit(self.connection.close).result()
        self._executor.shutdown()
