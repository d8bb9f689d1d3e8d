"""inferenced's durable state: leases, composite groups, models, quarantine.

Written before each reply (SQLite, WAL) so kill -9 and a restart lose
nothing a client was told.
"""

import asyncio
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from syntrop.inferenced.arbiter import Lease
from syntrop.system.sqlite import Database

#: The leases table's columns as schema 1 made them (schema 2 added
#: `exclusive`).
_LEASE_COLUMNS = """
        id TEXT PRIMARY KEY,
        plane TEXT NOT NULL,
        memory INTEGER NOT NULL,
        priority TEXT NOT NULL,
        state TEXT NOT NULL,
        owner_uid INTEGER NOT NULL,
        pid INTEGER,
        pid_start INTEGER,
        unit TEXT,
        cgroup TEXT,
        grp TEXT,
        role TEXT,
        stage_index INTEGER,
        seq INTEGER NOT NULL"""

MIGRATIONS = (
    f"""
    CREATE TABLE leases ({_LEASE_COLUMNS}
    );
    CREATE TABLE groups (
        id TEXT PRIMARY KEY,
        gang_id TEXT NOT NULL,
        gang_policy TEXT NOT NULL
    );
    CREATE TABLE models (
        id TEXT PRIMARY KEY,
        format TEXT NOT NULL,
        path TEXT NOT NULL,
        estimated_bytes INTEGER NOT NULL
    );
    CREATE TABLE quarantine (
        plane TEXT PRIMARY KEY,
        reason TEXT NOT NULL
    )
    """,
    # An exclusive EmergencyTriage lease holds its plane's compute.
    "ALTER TABLE leases ADD COLUMN exclusive INTEGER NOT NULL DEFAULT 0",
    # Keyed by the lease id itself (WITHOUT ROWID): one b-tree to write per
    # acquire or release instead of the rowid table and its id index, about
    # 3.5 µs of every lease change (docs/BENCHMARKS.md). Same columns, same
    # order: _UPSERT and load() read them by position.
    f"""
    CREATE TABLE leases_by_id ({_LEASE_COLUMNS},
        exclusive INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    INSERT INTO leases_by_id SELECT * FROM leases;
    DROP TABLE leases;
    ALTER TABLE leases_by_id RENAME TO leases
    """,
    # Whether the owner could name others' processes when granted (root or
    # lease-others): only then may its cgroup be frozen around them.
    "ALTER TABLE leases ADD COLUMN for_others INTEGER NOT NULL DEFAULT 0",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    """A lease with what only the service needs: process identity, cgroup,
    composite role."""

    lease: Lease
    pid_start: int | None
    cgroup: str | None
    role: str | None = None
    stage_index: int | None = None
    #: The owner could name other users' processes when granted (it was
    #: root, or lease-others was granted): each freeze checks it again
    #: otherwise (leases.foreign_uid).
    for_others: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    id: str
    gang_id: str
    gang_policy: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Model:
    id: str
    format: str
    path: str
    estimated_bytes: int


_UPSERT = f"INSERT OR REPLACE INTO leases VALUES ({', '.join('?' * 16)})"


def _row(record: LeaseRecord) -> tuple[object, ...]:
    lease = record.lease
    return (
        lease.id, lease.plane, lease.memory, lease.priority, lease.state, lease.owner_uid,
        lease.pid, record.pid_start, lease.unit, record.cgroup, lease.group, record.role,
        record.stage_index, lease.seq, int(lease.exclusive), int(record.for_others),
    )


class Store:
    def __init__(self, path: Path) -> None:
        # Lease writes are small and on every grant's path: committed on the
        # loop's thread, grouped per loop iteration (system/sqlite.py).
        self.db = Database(path, MIGRATIONS, commit_on_loop=True)

    def load(self) -> tuple[list[LeaseRecord], list[Group], list[Model], dict[str, str]]:
        def read(c: sqlite3.Connection) -> tuple[
            list[LeaseRecord], list[Group], list[Model], dict[str, str]
        ]:
            leases = [
                LeaseRecord(
                    lease=Lease(
                        id=r[0], plane=r[1], memory=r[2], priority=r[3], state=r[4],
                        owner_uid=r[5], pid=r[6], unit=r[8], group=r[10], seq=r[13],
                        exclusive=bool(r[14]),
                    ),
                    pid_start=r[7], cgroup=r[9], role=r[11], stage_index=r[12],
                    for_others=bool(r[15]),
                )
                for r in c.execute("SELECT * FROM leases ORDER BY seq")
            ]
            groups = [Group(id=r[0], gang_id=r[1], gang_policy=r[2])
                      for r in c.execute("SELECT * FROM groups")]
            models = [Model(id=r[0], format=r[1], path=r[2], estimated_bytes=r[3])
                      for r in c.execute("SELECT * FROM models ORDER BY id")]
            quarantine = dict(c.execute("SELECT plane, reason FROM quarantine").fetchall())
            return leases, groups, models, quarantine

        return self.db.sync(read)

    async def save(
        self,
        records: list[LeaseRecord],
        *,
        remove: Sequence[str] = (),
        group: Group | None = None,
        drop_groups: Sequence[str] = (),
    ) -> None:
        """Insert or update leases and remove others, in one transaction."""
        await self.save_later(records, remove=remove, group=group, drop_groups=drop_groups)

    def save_later(
        self,
        records: list[LeaseRecord],
        *,
        remove: Sequence[str] = (),
        group: Group | None = None,
        drop_groups: Sequence[str] = (),
    ) -> "asyncio.Future[None]":
        """`save`, queued now (in call order) for the next group commit: a
        future that resolves once it is committed."""

        def write(c: sqlite3.Connection) -> None:
            if group is not None:
                c.execute("INSERT OR REPLACE INTO groups VALUES (?, ?, ?)",
                          (group.id, group.gang_id, group.gang_policy))
            # execute for one row (the usual acquire or release): executemany
            # costs more than the statement itself then.
            if len(records) == 1:
                c.execute(_UPSERT, _row(records[0]))
            elif records:
                c.executemany(_UPSERT, [_row(r) for r in records])
            if len(remove) == 1:
                c.execute("DELETE FROM leases WHERE id = ?", (remove[0],))
            elif remove:
                c.executemany("DELETE FROM leases WHERE id = ?", [(i,) for i in remove])
            if drop_groups:
                c.executemany("DELETE FROM groups WHERE id = ?", [(i,) for i in drop_groups])

        return self.db.submit(write)

    async def set_states(self, states: dict[str, str]) -> None:
        def write(c: sqlite3.Connection) -> None:
            c.executemany("UPDATE leases SET state = ? WHERE id = ?",
                          [(state, lease_id) for lease_id, state in states.items()])

        await self.db.batched(write)

    async def put_model(self, model: Model) -> None:
        def write(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR REPLACE INTO models VALUES (?, ?, ?, ?)",
                      (model.id, model.format, model.path, model.estimated_bytes))

        await self.db.batched(write)

    async def set_quarantine(self, plane: str, reason: str | None) -> None:
        def write(c: sqlite3.Connection) -> None:
            if reason is None:
                c.execute("DELETE FROM quarantine WHERE plane = ?", (plane,))
            else:
                c.execute("INSERT OR REPLACE INTO quarantine VALUES (?, ?)", (plane, reason))

        await self.db.batched(write)

    def close(self) -> None:
        self.db.close()
