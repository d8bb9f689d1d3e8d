"""The audit log and the drop-in snapshots: SQLite, append-only.

Two rows per request: `requests` is written before anything is done (who,
what, the decision), `outcomes` when it is finished (sandbox layers, outcome,
rollback, details). A request without an outcome is one toold did not finish
(killed, crashed): GetAudit shows it as `interrupted`. Triggers refuse UPDATE
and DELETE on every table, so the log can only grow.

Rate limits are counted from this log, so they survive toold exiting on idle.
"""

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syntrop.system.sqlite import Database

#: Bytes of a request's parameters kept (a caller controls them).
MAX_PARAMETERS = 4096
MAX_MESSAGE = 2048

#: One statement each (the migration runner splits scripts on ';').
_APPEND_ONLY = [
    f"CREATE TRIGGER IF NOT EXISTS {table}_no_{verb} BEFORE {verb.upper()} ON {table}"
    " BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"
    for table in ("requests", "outcomes", "snapshots", "intents")
    for verb in ("update", "delete")
]

MIGRATIONS = [
    """
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        timestamp_usec INTEGER NOT NULL,
        uid INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        tool TEXT NOT NULL,
        unit TEXT,
        parameters TEXT NOT NULL,
        dry_run INTEGER NOT NULL,
        decision TEXT NOT NULL,
        error TEXT
    );
    CREATE INDEX requests_unit ON requests (unit, timestamp_usec);
    CREATE INDEX requests_time ON requests (decision, dry_run, timestamp_usec);
    CREATE TABLE outcomes (
        action_id INTEGER PRIMARY KEY REFERENCES requests (id),
        finished_usec INTEGER NOT NULL,
        sandbox TEXT NOT NULL,
        outcome TEXT NOT NULL,
        message TEXT NOT NULL,
        rolled_back INTEGER NOT NULL,
        details TEXT NOT NULL
    );
    CREATE TABLE snapshots (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        action_id INTEGER NOT NULL REFERENCES requests (id),
        unit TEXT NOT NULL,
        directory TEXT NOT NULL,
        taken_usec INTEGER NOT NULL,
        entries TEXT NOT NULL
    );
    CREATE INDEX snapshots_dir ON snapshots (directory, id);
    """,
    # What a revert is about to write, before it writes: a toold killed
    # mid-revert is finished from this by the next revert of the directory,
    # never undone as if its own half-write were the previous version.
    """
    CREATE TABLE intents (
        action_id INTEGER PRIMARY KEY REFERENCES requests (id),
        directory TEXT NOT NULL,
        target TEXT NOT NULL
    );
    CREATE INDEX intents_dir ON intents (directory, action_id);
    """,
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One request with its outcome, as GetAudit shows it."""

    id: int
    timestamp_usec: int
    uid: int
    pid: int
    tool: str
    unit: str | None
    parameters: Any
    dry_run: bool
    decision: str
    error: str | None
    sandbox: list[str]
    outcome: str
    message: str
    rolled_back: bool | None
    finished_usec: int | None
    details: Any


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parameters(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(repr(value)[:MAX_PARAMETERS])
    if len(text) > MAX_PARAMETERS:
        text = json.dumps({"truncated": text[:MAX_PARAMETERS]})
    return text


class Audit:
    """The log; every method is one transaction on the database's worker."""

    def __init__(self, path: Path) -> None:
        self.db = Database(path, MIGRATIONS)

        def triggers(c: sqlite3.Connection) -> None:
            for statement in _APPEND_ONLY:
                c.execute(statement)

        self.db.sync(triggers)

    def close(self) -> None:
        self.db.close()

    async def request(self, *, now_usec: int, uid: int, pid: int, tool: str, unit: str | None,
                      parameters: Any, dry_run: bool, decision: str,
                      error: str | None = None) -> int:
        params = _parameters(parameters)

        def insert(c: sqlite3.Connection) -> int:
            cursor = c.execute(
                "INSERT INTO requests (timestamp_usec, uid, pid, tool, unit, parameters,"
                " dry_run, decision, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (now_usec, uid, pid, _cap(tool, 256), unit, params, int(dry_run), decision,
                 error),
            )
            return int(cursor.lastrowid or 0)

        return await self.db.run(insert)

    async def outcome(self, action_id: int, *, now_usec: int, sandbox: list[str], outcome: str,
                      message: str, rolled_back: bool = False,
                      details: dict[str, Any] | None = None) -> None:
        text = json.dumps(details or {}, sort_keys=True, default=str)

        def insert(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO outcomes (action_id, finished_usec, sandbox, outcome, message,"
                " rolled_back, details) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (action_id, now_usec, json.dumps(sandbox), outcome, _cap(message, MAX_MESSAGE),
                 int(rolled_back), text),
            )

        await self.db.run(insert)

    async def recent(self, unit: str | None, since_usec: int) -> list[int]:
        """Timestamps of actions (allowed, not dry runs) since `since_usec`,
        on `unit` (None: on anything), oldest first."""

        def select(c: sqlite3.Connection) -> list[int]:
            query = ("SELECT timestamp_usec FROM requests WHERE decision = 'allowed'"
                     " AND dry_run = 0 AND timestamp_usec > ?")
            args: tuple[Any, ...] = (since_usec,)
            if unit is not None:
                query += " AND unit = ?"
                args += (unit,)
            return [row[0] for row in c.execute(query + " ORDER BY timestamp_usec", args)]

        return await self.db.run(select)

    async def rows(self, *, limit: int, unit: str | None = None) -> list[Row]:
        def select(c: sqlite3.Connection) -> list[Row]:
            query = (
                "SELECT r.id, r.timestamp_usec, r.uid, r.pid, r.tool, r.unit, r.parameters,"
                " r.dry_run, r.decision, r.error, o.sandbox, o.outcome, o.message,"
                " o.rolled_back, o.finished_usec, o.details"
                " FROM requests r LEFT JOIN outcomes o ON o.action_id = r.id"
            )
            args: tuple[Any, ...] = ()
            if unit is not None:
                query += " WHERE r.unit = ?"
                args = (unit,)
            query += " ORDER BY r.id DESC LIMIT ?"
            found = c.execute(query, (*args, limit)).fetchall()
            return [_row(values) for values in reversed(found)]

        return await self.db.run(select)

    async def snapshot(self, *, action_id: int, unit: str, directory: str, now_usec: int,
                       entries: list[dict[str, Any]]) -> int:
        def insert(c: sqlite3.Connection) -> int:
            cursor = c.execute(
                "INSERT INTO snapshots (action_id, unit, directory, taken_usec, entries)"
                " VALUES (?, ?, ?, ?, ?)",
                (action_id, unit, directory, now_usec, json.dumps(entries, sort_keys=True)),
            )
            return int(cursor.lastrowid or 0)

        return await self.db.run(insert)

    async def snapshots(self, directory: str, limit: int = 20) -> list[tuple[int, list[Any]]]:
        """The newest snapshots of `directory`, newest first: (id, entries)."""

        def select(c: sqlite3.Connection) -> list[tuple[int, list[Any]]]:
            return [(row[0], json.loads(row[1])) for row in c.execute(
                "SELECT id, entries FROM snapshots WHERE directory = ? ORDER BY id DESC LIMIT ?",
                (directory, limit))]

        return await self.db.run(select)

    async def intend(self, *, action_id: int, directory: str, target: list[Any]) -> None:
        def insert(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO intents (action_id, directory, target) VALUES (?, ?, ?)",
                      (action_id, directory, json.dumps(target, sort_keys=True)))

        await self.db.run(insert)

    async def interrupted(self, directory: str) -> tuple[int, list[Any]] | None:
        """The latest intent on `directory` whose action never finished:
        (action id, the entries it meant to leave)."""

        def select(c: sqlite3.Connection) -> tuple[int, list[Any]] | None:
            row = c.execute(
                "SELECT i.action_id, i.target FROM intents i"
                " LEFT JOIN outcomes o ON o.action_id = i.action_id"
                " WHERE i.directory = ? AND o.action_id IS NULL"
                " ORDER BY i.action_id DESC LIMIT 1", (directory,)).fetchone()
            return (int(row[0]), json.loads(row[1])) if row else None

        return await self.db.run(select)

    def run_sync(self, function: Callable[[sqlite3.Connection], Any]) -> Any:
        """For tests: a transaction now."""
        return self.db.sync(function)


def _row(values: tuple[Any, ...]) -> Row:
    (id_, timestamp, uid, pid, tool, unit, parameters, dry_run, decision, error, sandbox,
     outcome, message, rolled_back, finished, details) = values
    return Row(
        id=id_, timestamp_usec=timestamp, uid=uid, pid=pid, tool=tool, unit=unit,
        parameters=json.loads(parameters), dry_run=bool(dry_run), decision=decision,
        error=error,
        sandbox=json.loads(sandbox) if sandbox else [],
        outcome=outcome or "interrupted",
        message=message or ("" if outcome else "toold stopped before the action finished"),
        rolled_back=None if rolled_back is None else bool(rolled_back),
        finished_usec=finished,
        details=json.loads(details) if details else None,
    )
