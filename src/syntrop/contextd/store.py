"""contextd's durable state, in SQLite (WAL) through syntrop.system.sqlite:

- events: the timeline ring (with its diffs), pruned to the ring size and
  the retention;
- shadows: the last content seen of every watched file, so a restart finds
  what changed while contextd was not running;
- positions: where each package log was read up to;
- meta: the kernel journal cursor, which roots have a baseline.

A batch (events, the shadows and positions that produced them) is one
transaction: after a crash either all of it is there or none, so no change is
recorded twice or lost between the shadow and the event.
"""

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syntrop.contextd.logtail import Position
from syntrop.contextd.shadow import FileState
from syntrop.contextd.timeline import Record
from syntrop.system.sqlite import Database

MIGRATIONS = (
    """
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        ts INTEGER NOT NULL,
        kind TEXT NOT NULL,
        action TEXT NOT NULL,
        summary TEXT NOT NULL,
        unit TEXT,
        path TEXT,
        package TEXT,
        mode INTEGER,
        pid INTEGER,
        comm TEXT,
        keys TEXT NOT NULL,
        diff TEXT
    );
    CREATE TABLE shadows (
        path TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        mode INTEGER NOT NULL,
        size INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL,
        digest TEXT NOT NULL,
        content BLOB,
        target TEXT,
        binary INTEGER NOT NULL,
        error TEXT
    );
    CREATE TABLE positions (
        path TEXT PRIMARY KEY,
        inode INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        head TEXT NOT NULL
    );
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )
    """,
)


@dataclass(slots=True)
class Batch:
    """What one transaction writes."""

    events: list[tuple[Record, str | None]] = field(default_factory=list)
    shadows: dict[str, FileState | None] = field(default_factory=dict)
    positions: dict[str, Position | None] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    prune_through: int = 0  # delete events with id <= this

    def __bool__(self) -> bool:
        return bool(self.events or self.shadows or self.positions or self.meta
                    or self.prune_through)


@dataclass(slots=True)
class Loaded:
    records: list[Record]
    shadows: dict[str, FileState]
    positions: dict[str, Position]
    meta: dict[str, str]


def _state(row: Sequence[Any]) -> FileState:
    kind, mode, size, mtime_ns, digest, content, target, binary, error = row
    return FileState(kind=str(kind), mode=int(mode), size=int(size),
                     mtime_ns=int(mtime_ns), digest=str(digest),
                     content=content if isinstance(content, bytes) else None,
                     target=target if isinstance(target, str) else None, binary=bool(binary),
                     error=error if isinstance(error, str) else None)


class Store:
    def __init__(self, path: Path) -> None:
        self.db = Database(path, MIGRATIONS)

    def load(self, ring_size: int, since_usec: int) -> Loaded:
        def read(connection: sqlite3.Connection) -> Loaded:
            rows = connection.execute(
                "SELECT id, ts, kind, action, summary, unit, path, package, mode, pid, comm, keys,"
                " diff IS NOT NULL FROM events WHERE ts >= ? ORDER BY id DESC LIMIT ?",
                (since_usec, ring_size)).fetchall()
            records = [
                Record(id=r[0], timestamp_usec=r[1], kind=r[2], action=r[3], summary=r[4],
                       unit=r[5], path=r[6], package=r[7], mode=r[8], pid=r[9], comm=r[10],
                       keys=tuple(json.loads(r[11])), has_diff=bool(r[12]))
                for r in reversed(rows)
            ]
            shadows = {
                row[0]: _state(row[1:])
                for row in connection.execute(
                    "SELECT path, kind, mode, size, mtime_ns, digest, content, target, binary,"
                    " error FROM shadows")
            }
            positions = {
                row[0]: Position(row[1], row[2], row[3])
                for row in connection.execute("SELECT path, inode, offset, head FROM positions")
            }
            meta = dict(connection.execute("SELECT key, value FROM meta").fetchall())
            last = connection.execute("SELECT max(id) FROM events").fetchone()[0]
            meta.setdefault("last_id", str(last or 0))
            return Loaded(records, shadows, positions, meta)

        return self.db.sync(read)

    @staticmethod
    def _write(connection: sqlite3.Connection, batch: Batch) -> None:
        connection.executemany(
            "INSERT INTO events (id, ts, kind, action, summary, unit, path, package, mode, pid,"
            " comm, keys, diff) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(r.id, r.timestamp_usec, r.kind, r.action, r.summary, r.unit, r.path, r.package,
              r.mode, r.pid, r.comm, json.dumps(r.keys), diff) for r, diff in batch.events])
        upserts = [(path, s.kind, s.mode, s.size, s.mtime_ns, s.digest, s.content, s.target,
                    int(s.binary), s.error) for path, s in batch.shadows.items() if s is not None]
        connection.executemany(
            "INSERT OR REPLACE INTO shadows (path, kind, mode, size, mtime_ns, digest, content,"
            " target, binary, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", upserts)
        connection.executemany(
            "DELETE FROM shadows WHERE path = ?",
            [(path,) for path, s in batch.shadows.items() if s is None])
        for path, position in batch.positions.items():
            if position is None:
                connection.execute("DELETE FROM positions WHERE path = ?", (path,))
            else:
                connection.execute(
                    "INSERT OR REPLACE INTO positions (path, inode, offset, head)"
                    " VALUES (?, ?, ?, ?)", (path, position.inode, position.offset, position.head))
        connection.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                               list(batch.meta.items()))
        if batch.prune_through:
            connection.execute("DELETE FROM events WHERE id <= ?", (batch.prune_through,))

    async def write(self, batch: Batch) -> None:
        await self.db.run(lambda connection: self._write(connection, batch))

    def write_now(self, batch: Batch) -> None:
        self.db.sync(lambda connection: self._write(connection, batch))

    async def diffs(self, ids: Iterable[int]) -> dict[int, str]:
        wanted = list(ids)

        def read(connection: sqlite3.Connection) -> dict[int, str]:
            found: dict[int, str] = {}
            for start in range(0, len(wanted), 500):
                chunk = wanted[start:start + 500]
                marks = ",".join("?" * len(chunk))
                for event_id, diff in connection.execute(
                        f"SELECT id, diff FROM events WHERE id IN ({marks}) AND diff IS NOT NULL",
                        chunk):
                    found[event_id] = diff
            return found

        if not wanted:
            return {}
        return await self.db.run(read)

    def close(self) -> None:
        self.db.close()
