"""Incidents, breaker states and the supervisor's memory in SQLite
(syntrop.system.sqlite.Database): persisted before any reply that reports
them. The memory (the start of each unit's last run that went well, the
plans that ran and did not heal it) outlives sentry's own restarts: sentry
exits when idle, and a failure after that must not make a drop-in the unit
ran well with look guilty, nor run a plan that already failed again."""

import json
import sqlite3
from pathlib import Path

from syntrop.sentry.breaker import State
from syntrop.sentry.findings import Cause
from syntrop.sentry.pipeline import IncidentRecord, PhaseRecord, StepRecord
from syntrop.system.sqlite import Database

MIGRATIONS = [
    """
    CREATE TABLE incidents (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        unit TEXT NOT NULL,
        detected_usec INTEGER NOT NULL,
        trigger TEXT NOT NULL,
        decision TEXT,
        decided_by TEXT,
        result TEXT NOT NULL,
        phases TEXT NOT NULL,
        summary TEXT NOT NULL
    );
    CREATE INDEX incidents_unit ON incidents(unit, seq);
    CREATE TABLE breakers (
        unit TEXT PRIMARY KEY,
        attempts INTEGER NOT NULL,
        window_start_usec INTEGER NOT NULL,
        last_attempt_usec INTEGER NOT NULL,
        needs_human INTEGER NOT NULL
    )
    """,
    """
    ALTER TABLE incidents ADD COLUMN cause TEXT;
    ALTER TABLE incidents ADD COLUMN plan TEXT;
    ALTER TABLE incidents ADD COLUMN findings TEXT
    """,
    """
    CREATE TABLE ran_well (
        unit TEXT PRIMARY KEY,
        since_usec INTEGER NOT NULL
    );
    CREATE TABLE tried (
        unit TEXT NOT NULL,
        plan TEXT NOT NULL,
        at_usec INTEGER NOT NULL,
        PRIMARY KEY (unit, plan)
    )
    """,
]

MAX_INCIDENTS = 10_000


def _incident(row: tuple[object, ...]) -> IncidentRecord:
    (ident, unit, detected, trigger, decision, decided_by, result, phases, summary,
     cause, plan, findings) = row
    found = json.loads(str(cause)) if cause else None
    return IncidentRecord(
        id=str(ident), unit=str(unit), detected_usec=int(str(detected)), trigger=str(trigger),
        decision=None if decision is None else str(decision),
        decided_by=None if decided_by is None else str(decided_by),
        result=str(result),
        phases=[PhaseRecord(**p) for p in json.loads(str(phases))],
        summary=str(summary),
        cause=None if found is None else Cause(**{**found,
                                                  "evidence": tuple(found["evidence"])}),
        plan=[StepRecord(**s) for s in json.loads(str(plan))] if plan else [],
        findings=list(json.loads(str(findings))) if findings else [])


_COLUMNS = ("id, unit, detected_usec, trigger, decision, decided_by, result, phases, summary, "
            "cause, plan, findings")


class Store:
    def __init__(self, path: Path) -> None:
        self.db = Database(path, MIGRATIONS)

    def close(self) -> None:
        self.db.close()

    async def put_incident(self, incident: IncidentRecord) -> None:
        phases = json.dumps([
            {"name": p.name, "started_usec": p.started_usec, "duration_usec": p.duration_usec,
             "budget_usec": p.budget_usec, "outcome": p.outcome, "detail": p.detail}
            for p in incident.phases])

        cause = None if incident.cause is None else json.dumps(
            {"kind": incident.cause.kind, "fixable": incident.cause.fixable,
             "summary": incident.cause.summary, "subject": incident.cause.subject,
             "package": incident.cause.package, "evidence": list(incident.cause.evidence)})
        plan = json.dumps([{"tool": s.tool, "parameters": s.parameters, "outcome": s.outcome,
                            "message": s.message} for s in incident.plan])
        findings = json.dumps(incident.findings)

        def put(c: sqlite3.Connection) -> None:
            c.execute(
                f"INSERT INTO incidents ({_COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET decision=excluded.decision, "
                "decided_by=excluded.decided_by, result=excluded.result, "
                "phases=excluded.phases, summary=excluded.summary, cause=excluded.cause, "
                "plan=excluded.plan, findings=excluded.findings",
                (incident.id, incident.unit, incident.detected_usec, incident.trigger,
                 incident.decision, incident.decided_by, incident.result, phases,
                 incident.summary, cause, plan, findings))
            c.execute("DELETE FROM incidents WHERE seq <= "
                      "(SELECT MAX(seq) FROM incidents) - ?", (MAX_INCIDENTS,))

        await self.db.run(put)

    async def incident(self, ident: str) -> IncidentRecord | None:
        def get(c: sqlite3.Connection) -> IncidentRecord | None:
            row = c.execute(f"SELECT {_COLUMNS} FROM incidents WHERE id = ?",
                            (ident,)).fetchone()
            return None if row is None else _incident(row)

        return await self.db.run(get)

    async def incidents(self, *, limit: int, unit: str | None = None) -> list[IncidentRecord]:
        """The newest `limit`, oldest first."""
        def get(c: sqlite3.Connection) -> list[IncidentRecord]:
            where, args = ("WHERE unit = ?", [unit]) if unit is not None else ("", [])
            rows = c.execute(
                f"SELECT {_COLUMNS} FROM incidents {where} ORDER BY seq DESC LIMIT ?",
                (*args, limit)).fetchall()
            return [_incident(r) for r in reversed(rows)]

        return await self.db.run(get)

    async def interrupted(self) -> int:
        """Close incidents left in progress by a sentry that was killed
        mid-triage (at start-up); how many."""
        def put(c: sqlite3.Connection) -> int:
            return c.execute(
                "UPDATE incidents SET result = 'interrupted', summary = unit || "
                "': interrupted: systemd-sentry stopped while triaging; what it had started "
                "may not have finished' WHERE result = 'in_progress'").rowcount

        return await self.db.run(put)

    async def counts(self) -> tuple[int, int]:
        """(incidents in progress, incidents in all)."""
        def get(c: sqlite3.Connection) -> tuple[int, int]:
            row = c.execute("SELECT SUM(result = 'in_progress'), COUNT(*) "
                            "FROM incidents").fetchone()
            return int(row[0] or 0), int(row[1] or 0)

        return await self.db.run(get)

    async def breaker(self, unit: str) -> State:
        def get(c: sqlite3.Connection) -> State:
            row = c.execute("SELECT attempts, window_start_usec, last_attempt_usec, "
                            "needs_human FROM breakers WHERE unit = ?", (unit,)).fetchone()
            if row is None:
                return State(unit=unit)
            return State(unit=unit, attempts=row[0], window_start_usec=row[1],
                         last_attempt_usec=row[2], needs_human=bool(row[3]))

        return await self.db.run(get)

    async def breakers(self) -> list[State]:
        def get(c: sqlite3.Connection) -> list[State]:
            rows = c.execute("SELECT unit, attempts, window_start_usec, last_attempt_usec, "
                             "needs_human FROM breakers ORDER BY unit").fetchall()
            return [State(unit=r[0], attempts=r[1], window_start_usec=r[2],
                          last_attempt_usec=r[3], needs_human=bool(r[4])) for r in rows]

        return await self.db.run(get)

    async def put_breaker(self, state: State) -> None:
        def put(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR REPLACE INTO breakers (unit, attempts, window_start_usec, "
                      "last_attempt_usec, needs_human) VALUES (?, ?, ?, ?, ?)",
                      (state.unit, state.attempts, state.window_start_usec,
                       state.last_attempt_usec, int(state.needs_human)))

        await self.db.run(put)

    async def reset_breaker(self, unit: str) -> None:
        def put(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM breakers WHERE unit = ?", (unit,))

        await self.db.run(put)

    async def ran_well(self, unit: str) -> int:
        """When the unit's last run known to have gone well began (0: none)."""
        def get(c: sqlite3.Connection) -> int:
            row = c.execute("SELECT since_usec FROM ran_well WHERE unit = ?",
                            (unit,)).fetchone()
            return 0 if row is None else int(row[0])

        return await self.db.run(get)

    async def put_ran_well(self, unit: str, since_usec: int) -> None:
        def put(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR REPLACE INTO ran_well (unit, since_usec) VALUES (?, ?)",
                      (unit, since_usec))

        await self.db.run(put)

    async def tried(self, unit: str, since_usec: int) -> frozenset[str]:
        """The plans that ran on the unit at or after `since_usec` and did not
        heal it; older ones are forgotten."""
        def get(c: sqlite3.Connection) -> frozenset[str]:
            c.execute("DELETE FROM tried WHERE unit = ? AND at_usec < ?", (unit, since_usec))
            rows = c.execute("SELECT plan FROM tried WHERE unit = ?", (unit,)).fetchall()
            return frozenset(str(r[0]) for r in rows)

        return await self.db.run(get)

    async def put_tried(self, unit: str, plan: str, at_usec: int) -> None:
        def put(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR REPLACE INTO tried (unit, plan, at_usec) VALUES (?, ?, ?)",
                      (unit, plan, at_usec))

        await self.db.run(put)

    async def forget_tried(self, unit: str) -> None:
        """The unit healed, or an operator reset its breaker: no plan of the
        window is held against it."""
        def put(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM tried WHERE unit = ?", (unit,))

        await self.db.run(put)
