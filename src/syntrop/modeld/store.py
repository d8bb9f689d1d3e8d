"""modeld's manifests in SQLite (WAL): blobs, the names that use them, and
the journal of partial pulls. The bytes live in the blob tree (blobs.py);
a row is written only after its blob is linked into place, and removed
before its blob is unlinked, so a crash leaves at worst an orphan file,
which the next start removes."""

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from syntrop.system.sqlite import Database

MIGRATIONS = (
    """
    CREATE TABLE blobs (
        digest TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        format TEXT NOT NULL,
        architecture TEXT,
        quantization TEXT,
        license TEXT,
        added_usec INTEGER NOT NULL
    );
    CREATE TABLE models (
        name TEXT NOT NULL,
        tag TEXT NOT NULL,
        digest TEXT NOT NULL REFERENCES blobs(digest),
        pinned INTEGER NOT NULL,
        last_access_usec INTEGER NOT NULL,
        source TEXT,
        PRIMARY KEY (name, tag)
    );
    CREATE TABLE partials (
        digest TEXT PRIMARY KEY,
        size INTEGER,
        durable_bytes INTEGER NOT NULL,
        source TEXT,
        updated_usec INTEGER NOT NULL
    )
    """,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Blob:
    digest: str
    size: int
    format: str
    architecture: str | None
    quantization: str | None
    license: str | None
    added_usec: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """A name:tag and the blob it points at."""

    name: str
    tag: str
    digest: str
    pinned: bool
    last_access_usec: int
    source: str | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.tag)


@dataclass(frozen=True, slots=True, kw_only=True)
class Partial:
    digest: str
    size: int | None
    durable_bytes: int
    source: str | None
    updated_usec: int


class Manifests:
    def __init__(self, path: Path) -> None:
        self.db = Database(path, MIGRATIONS)

    def load(self) -> tuple[dict[str, Blob], dict[tuple[str, str], Entry]]:
        def read(c: sqlite3.Connection) -> tuple[dict[str, Blob], dict[tuple[str, str], Entry]]:
            blobs = {
                r[0]: Blob(digest=r[0], size=r[1], format=r[2], architecture=r[3],
                           quantization=r[4], license=r[5], added_usec=r[6])
                for r in c.execute("SELECT * FROM blobs")
            }
            entries = {
                (r[0], r[1]): Entry(name=r[0], tag=r[1], digest=r[2], pinned=bool(r[3]),
                                    last_access_usec=r[4], source=r[5])
                for r in c.execute("SELECT * FROM models")
            }
            return blobs, entries

        return self.db.sync(read)

    async def put(self, entry: Entry, blob: Blob | None = None) -> None:
        """Add or replace a name (and its blob's row, if new), in one transaction."""

        def write(c: sqlite3.Connection) -> None:
            if blob is not None:
                c.execute(
                    "INSERT OR IGNORE INTO blobs VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (blob.digest, blob.size, blob.format, blob.architecture,
                     blob.quantization, blob.license, blob.added_usec),
                )
            c.execute(
                "INSERT OR REPLACE INTO models VALUES (?, ?, ?, ?, ?, ?)",
                (entry.name, entry.tag, entry.digest, int(entry.pinned),
                 entry.last_access_usec, entry.source),
            )

        await self.db.run(write)

    async def remove(
        self, keys: Iterable[tuple[str, str]] = (), digests: Iterable[str] = ()
    ) -> None:
        keys, digests = list(keys), list(digests)

        def write(c: sqlite3.Connection) -> None:
            c.executemany("DELETE FROM models WHERE name = ? AND tag = ?", keys)
            c.executemany("DELETE FROM blobs WHERE digest = ?", [(d,) for d in digests])

        await self.db.run(write)

    async def set_pinned(self, key: tuple[str, str], pinned: bool) -> None:
        def write(c: sqlite3.Connection) -> None:
            c.execute("UPDATE models SET pinned = ? WHERE name = ? AND tag = ?",
                      (int(pinned), *key))

        await self.db.run(write)

    async def touch(self, key: tuple[str, str], usec: int) -> None:
        def write(c: sqlite3.Connection) -> None:
            c.execute("UPDATE models SET last_access_usec = ? WHERE name = ? AND tag = ?",
                      (usec, *key))

        await self.db.run(write)

    # the journal of partial pulls -------------------------------------------

    async def partial(self, digest: str) -> Partial | None:
        def read(c: sqlite3.Connection) -> Partial | None:
            r = c.execute("SELECT * FROM partials WHERE digest = ?", (digest,)).fetchone()
            if r is None:
                return None
            return Partial(digest=r[0], size=r[1], durable_bytes=r[2], source=r[3],
                           updated_usec=r[4])

        return await self.db.run(read)

    async def journal(self, partial: Partial) -> None:
        def write(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT OR REPLACE INTO partials VALUES (?, ?, ?, ?, ?)",
                (partial.digest, partial.size, partial.durable_bytes, partial.source,
                 partial.updated_usec),
            )

        await self.db.run(write)

    async def forget_partial(self, digest: str) -> None:
        def write(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM partials WHERE digest = ?", (digest,))

        await self.db.run(write)

    def partial_digests(self) -> set[str]:
        def read(c: sqlite3.Connection) -> set[str]:
            return {r[0] for r in c.execute("SELECT digest FROM partials")}

        return self.db.sync(read)

    def forget_sync(self, keys: Iterable[tuple[str, str]] = (), digests: Iterable[str] = (),
                    partials: Iterable[str] = ()) -> None:
        """Remove rows at start-up (blocking), in one transaction."""
        keys, digests, partials = list(keys), list(digests), list(partials)

        def write(c: sqlite3.Connection) -> None:
            c.executemany("DELETE FROM models WHERE name = ? AND tag = ?", keys)
            c.executemany("DELETE FROM blobs WHERE digest = ?", [(d,) for d in digests])
            c.executemany("DELETE FROM partials WHERE digest = ?", [(d,) for d in partials])

        self.db.sync(write)

    def close(self) -> None:
        self.db.close()
