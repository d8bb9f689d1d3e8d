"""The Varlink face of contextd: io.syntrop.Context1.

Each method validates its parameters, asks the recorder, and maps records
to the contract's types. Everything that reads files, logs or the journal
lives in the domain modules (recorder, feeds, journal, shadow, …).
"""

import asyncio
import contextlib
import logging
import os
import signal

from syntrop.config import Paths
from syntrop.contextd import access, journal, units
from syntrop.contextd.config import Config, load
from syntrop.contextd.explain import explain
from syntrop.contextd.recorder import Recorder
from syntrop.contextd.store import Store
from syntrop.contextd.timeline import Record
from syntrop.interfaces.context import (
    Context1,
    Event,
    EventNotFound,
    InvalidUnitName,
    InvalidWindow,
    JournalEntry,
    StatusResult,
    UnitContext,
    UnitNotFound,
)
from syntrop.varlink import InvalidParameter, current_peer, implements

logger = logging.getLogger(__name__)

KINDS = ("unit_file", "dropin", "config", "package", "kernel")
MAX_CONTEXT_EVENTS = 1000
MAX_LISTED = 10_000
#: Failure times further ahead than this (clock skew allowance) are refused.
FUTURE_USEC = 24 * 3600 * 1_000_000
#: Diff bytes in one GetUnitContext reply, at most (messages are capped at
#: 16 MiB); past it the rest have has_diff set and GetEvent gives them.
MAX_DIFFS_PER_REPLY = 8 * 1024 * 1024


def _event(record: Record, *, diff: str | None = None, relevance: float | None = None) -> Event:
    return Event(id=record.id, timestamp_usec=record.timestamp_usec, kind=record.kind,
                 action=record.action, summary=record.summary, unit=record.unit,
                 path=record.path, package=record.package, mode=record.mode, pid=record.pid,
                 comm=record.comm, has_diff=record.has_diff, diff=diff, relevance=relevance)


def _entry(line: journal.Line) -> JournalEntry:
    return JournalEntry(timestamp_usec=line.timestamp_usec, priority=line.priority,
                        message=line.message, unit=line.unit, pid=line.pid, cursor=line.cursor)


class ContextService(Context1):
    """Knows what changed on the host."""

    def __init__(self, paths: Paths, config: Config | None = None) -> None:
        self.paths = paths
        self.config = config or load(str(paths.configuration / "contextd.toml"))
        self.store = Store(paths.state / "contextd.db")
        self.recorder = Recorder(self.config, self.store)
        self.starting: asyncio.Task[None]

    @classmethod
    async def open(cls, paths: Paths) -> "ContextService":
        """Serve at once; the recorder's start (loading the ring, comparing
        every watched file with its shadow) runs behind the first replies,
        and every method that reads the timeline waits for it. Socket
        activation pays for the start-up of the first call only when that
        call needs the timeline."""
        service = cls(paths)
        service.starting = asyncio.get_running_loop().create_task(
            service.recorder.start(), name="contextd-start"
        )
        service.starting.add_done_callback(_start_failed)
        return service

    async def ready(self) -> None:
        """Wait for the recorder's start; shielded, so a caller that goes
        away does not cancel it for everyone."""
        await asyncio.shield(self.starting)

    def keep_alive(self) -> bool:
        """Stay up while watching (unless exit_on_idle): a change made while
        contextd is down is found at the next start, but without its writer
        and without the steps in between."""
        return self.recorder.keep_alive()

    async def aclose(self) -> None:
        if not self.starting.done():
            self.starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.starting
        await self.recorder.close()
        self.store.close()

    @implements
    async def GetUnitContext(
        self,
        *,
        unit: str,
        window_usec: int | None = None,
        failure_usec: int | None = None,
        invocation_id: str | None = None,
        include_diffs: bool | None = None,
        limit: int | None = None,
    ) -> UnitContext:
        await self.ready()
        if not units.is_instance_or_plain(unit):
            raise InvalidUnitName(unit=unit)
        retention = self.config.retention_usec
        window = self.config.default_window_usec if window_usec is None else window_usec
        if not 0 <= window <= retention:
            raise InvalidWindow(window_usec=window, max_usec=retention)
        if failure_usec is not None and not (
                0 <= failure_usec <= self.recorder.clock() + FUTURE_USEC):
            raise InvalidParameter(parameter="failure_usec")
        if invocation_id is not None and not journal.is_invocation_id(invocation_id):
            raise InvalidParameter(parameter="invocation_id")
        count = 50 if limit is None else limit
        if not 1 <= count <= MAX_CONTEXT_EVENTS:
            raise InvalidParameter(parameter="limit")
        found = await explain(self.recorder, unit, window_usec=window, failure_usec=failure_usec,
                              invocation_id=invocation_id, limit=count)
        if not found.known:
            raise UnitNotFound(unit=unit)
        lines, journal_error = await _visible(unit, found.lines, found.journal_error)
        diffs = await self.recorder.diffs(
            r.id for r, _ in found.events if r.has_diff) if include_diffs else {}
        budget = MAX_DIFFS_PER_REPLY
        for record, _ in found.events:  # most relevant first keep theirs
            diff = diffs.get(record.id)
            if diff is not None:
                budget -= len(diff)
                if budget < 0:
                    del diffs[record.id]
        return UnitContext(
            unit=unit, failure_usec=found.failure_usec, invocation_id=found.invocation_id,
            events=[_event(r, diff=diffs.get(r.id), relevance=rel) for r, rel in found.events],
            journal=[_entry(line) for line in lines], journal_error=journal_error,
            dropped_events=self.recorder.counters.dropped)

    @implements
    async def ListEvents(
        self, *, since_usec: int | None = None, kind: str | None = None,
        limit: int | None = None, after_id: int | None = None,
    ) -> list[Event]:
        await self.ready()
        if since_usec is not None and since_usec < 0:
            raise InvalidParameter(parameter="since_usec")
        if after_id is not None and after_id < 0:
            raise InvalidParameter(parameter="after_id")
        if kind is not None and kind not in KINDS:
            raise InvalidParameter(parameter="kind")
        count = 1000 if limit is None else limit
        if not 0 <= count <= MAX_LISTED:
            raise InvalidParameter(parameter="limit")
        await self.recorder.kernel_feed.poll()
        return [_event(r) for r in self.recorder.ring.listing(since_usec, kind, count,
                                                              after_id=after_id)]

    @implements
    async def GetEvent(self, *, id: int) -> Event:
        await self.ready()
        record = self.recorder.ring.get(id)
        if record is None:
            raise EventNotFound(id=id)
        diffs = await self.recorder.diffs([id]) if record.has_diff else {}
        return _event(record, diff=diffs.get(id))

    @implements
    async def GetStatus(self) -> StatusResult:
        await self.ready()
        recorder = self.recorder
        return StatusResult(
            events=len(recorder.ring), ring_size=self.config.ring_size,
            dropped_events=recorder.counters.dropped,
            queue_overflows=recorder.counters.overflows,
            skipped_lines=recorder.counters.skipped, watched_paths=recorder.watcher.watched,
            shadow_bytes=recorder.shadow_total, fanotify=recorder.fanotify is not None)


async def _visible(unit: str, lines: list[journal.Line],
                   error: str | None) -> tuple[list[journal.Line], str | None]:
    """The journal lines the caller may have (see access), and the reply's
    journal_error: the refusal when it may have none."""
    uid, own = current_peer().uid, os.geteuid()
    groups: frozenset[str] = frozenset()
    if uid not in (0, own):
        groups = await asyncio.to_thread(access.groups_of, uid)  # NSS may block
    shown, refused = access.visible(unit, lines, caller_uid=uid, groups=groups, own_uid=own)
    return shown, refused or error


def _start_failed(task: "asyncio.Task[None]") -> None:
    """A recorder that cannot start leaves nothing to serve: say why once
    and stop the daemon (systemd restarts it or records the failure)."""
    if task.cancelled() or task.exception() is None:
        return
    logger.error("contextd cannot start recording: %s", task.exception())
    os.kill(os.getpid(), signal.SIGTERM)
