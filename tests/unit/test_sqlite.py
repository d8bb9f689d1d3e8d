"""syntrop/system/sqlite.py's group commit: concurrent work shares one
COMMIT, each caller returns once its own work is committed, and one that
fails is undone alone; on the worker thread or, with commit_on_loop, on the
loop's (checkpointed apart)."""

import asyncio
import itertools
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from syntrop.system.sqlite import CHECKPOINT_EVERY, Database

SCHEMA = ("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)",)


@pytest.mark.parametrize("on_loop", [False, True])
def test_concurrent_work_shares_commits_and_a_failure_is_undone_alone(
        tmp_path: Path, on_loop: bool) -> None:
    db = Database(tmp_path / "t.db", SCHEMA, commit_on_loop=on_loop)

    def insert(key: int, value: str | None) -> Callable[[sqlite3.Connection], int]:
        def write(c: sqlite3.Connection) -> int:
            c.execute("INSERT INTO t VALUES (?, ?)", (key, value))  # NULL fails: NOT NULL
            return key
        return write

    async def many() -> list[object]:
        return await asyncio.gather(
            *(db.batched(insert(k, None if k == 13 else str(k))) for k in range(100)),
            return_exceptions=True)

    results = asyncio.run(many())
    assert [r for r in results if isinstance(r, int)] == [k for k in range(100) if k != 13]
    assert isinstance(results[13], sqlite3.IntegrityError)
    assert db.grouped == 100 and db.commits < 100  # grouped: fewer commits than work
    db.close()
    # Durable: another connection sees exactly what was reported committed.
    other = sqlite3.connect(tmp_path / "t.db")
    keys = [k for (k,) in other.execute("SELECT k FROM t ORDER BY k")]
    other.close()
    assert keys == [k for k in range(100) if k != 13]


@pytest.mark.parametrize("on_loop", [False, True])
def test_a_lone_caller_is_committed_at_once(tmp_path: Path, on_loop: bool) -> None:
    db = Database(tmp_path / "t.db", SCHEMA, commit_on_loop=on_loop)
    for key in range(3):
        def insert(c: sqlite3.Connection, key: int = key) -> int:
            return c.execute("INSERT INTO t VALUES (?, 'x')", (key,)).rowcount
        assert asyncio.run(db.batched(insert)) == 1
    assert db.commits == 3
    with pytest.raises(sqlite3.IntegrityError):
        asyncio.run(db.batched(lambda c: c.execute("INSERT INTO t VALUES (0, 'dup')")))
    assert db.sync(lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0]) == 3
    db.close()


def test_after_a_shared_commit_the_loop_waits_an_iteration_for_more(tmp_path: Path) -> None:
    """commit_on_loop: once a commit held more than one caller's work (they
    come concurrently), the next waits one more loop iteration, so that
    work arriving in that iteration shares it; a lone caller's does not
    wait (test_a_lone_caller_is_committed_at_once)."""
    db = Database(tmp_path / "t.db", SCHEMA, commit_on_loop=True)

    def insert(key: int) -> Callable[[sqlite3.Connection], object]:
        return lambda c: c.execute("INSERT INTO t VALUES (?, 'x')", (key,))

    async def scenario() -> int:
        await asyncio.gather(db.batched(insert(1)), db.batched(insert(2)))  # one commit of two
        before = db.commits
        loop = asyncio.get_running_loop()
        late: list[asyncio.Future[object]] = []
        first = db.submit(insert(3))
        loop.call_soon(lambda: late.append(db.submit(insert(4))))  # the next iteration's
        await first
        await late[0]
        return db.commits - before

    assert asyncio.run(scenario()) == 1
    db.close()


def test_loop_commits_are_checkpointed_by_the_worker(tmp_path: Path) -> None:
    """commit_on_loop turns automatic checkpoints off (their fsync would
    stall the loop); the worker copies the WAL into the database every
    CHECKPOINT_EVERY commits instead."""
    path = tmp_path / "t.db"
    db = Database(path, SCHEMA, commit_on_loop=True)
    empty = path.stat().st_size

    async def commit(key: int) -> None:
        await db.batched(lambda c: c.execute("INSERT INTO t VALUES (?, ?)", (key, "x" * 4000)))

    async def commits(keys: range) -> None:
        for key in keys:
            await commit(key)

    asyncio.run(commits(range(CHECKPOINT_EVERY - 1)))
    assert path.stat().st_size == empty  # all of it in the WAL still
    asyncio.run(commits(range(CHECKPOINT_EVERY - 1, CHECKPOINT_EVERY)))
    assert db._checkpointing is not None
    db._checkpointing.result(timeout=10)
    assert path.stat().st_size > CHECKPOINT_EVERY * 4000
    db.close()
    other = sqlite3.connect(path)
    assert other.execute("SELECT count(*) FROM t").fetchone()[0] == CHECKPOINT_EVERY
    other.close()


def test_the_wal_starts_over_while_loop_commits_keep_coming(tmp_path: Path) -> None:
    """A checkpoint that runs beside commits leaves the frames written
    meanwhile, and SQLite starts the WAL over only after one that left
    nothing: the worker finishes with commits held off, so that under
    commits without a pause (a lease taken and given back, again and
    again) the WAL starts over instead of growing by every commit. Seen in
    the WAL's header: its checkpoint sequence number counts the times it
    started over (however long the disk takes to sync)."""
    path = tmp_path / "t.db"
    db = Database(path, ("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT NOT NULL)",),
                  commit_on_loop=True)
    wal = Path(f"{path}-wal")

    def started_over() -> int:
        with wal.open("rb") as file:
            return int.from_bytes(file.read(16)[12:16], "big")

    def change(sql: str, *values: str) -> Callable[[sqlite3.Connection], object]:
        return lambda c: c.execute(sql, values)

    async def client() -> int:
        deadline = asyncio.get_running_loop().time() + 20
        keys = itertools.count()
        while started_over() < 2 and asyncio.get_running_loop().time() < deadline:
            for _ in range(CHECKPOINT_EVERY):
                key = str(next(keys))
                await db.batched(change("INSERT INTO t VALUES (?, ?)", key, "x" * 100))
                await db.batched(change("DELETE FROM t WHERE k = ?", key))
        return started_over()

    assert asyncio.run(client()) >= 2
    db.close()
