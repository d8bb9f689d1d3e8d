"""io.syntrop.Context1: what changed, as one timeline (contextd)."""

from dataclasses import dataclass
from typing import TypedDict

from asyncvarlink import TypedVarlinkErrorReply

from syntrop.interfaces import names
from syntrop.varlink.contract import Interface, method

NAME = names.CONTEXT


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One change on the host.

    Fields:
        id: Sequence number in the timeline; grows with each event recorded.
        timestamp_usec: When it happened, microseconds since the epoch: when
            the change was seen; for a file changed while contextd was not
            running, its modification time; for package and kernel events,
            the time their log gives.
        kind: unit_file (a unit file or an enablement link), dropin (a file in
            a <unit>.d/ directory), config (a file a unit references, such as
            its EnvironmentFile=), package or kernel.
        action: What happened: created, modified, deleted or mode for files;
            install, upgrade, downgrade, reinstall, remove, purge, conffile or
            transaction for packages; oom, segfault, gpu, pcie, hung_task or io_error
            for the kernel.
        summary: One line suitable for an LLM prompt.
        unit: The unit it concerns, when known (a template such as foo@.service
            or a prefix such as foo-.service for drop-ins that apply to several).
        path: The file changed, for file events and conffile decisions.
        package: The package, for package events.
        mode: The file's permission bits after the change (before it, for a
            deletion).
        pid: The writing process, when fanotify could tell.
        comm: The writing process's name, when known.
        has_diff: Whether a unified diff is stored (GetEvent returns it).
        diff: Unified diff before → after; only when asked for, capped in size.
        relevance: Rank within a GetUnitContext answer, 0 to 1, higher first.
    """

    id: int
    timestamp_usec: int
    kind: str
    action: str
    summary: str
    unit: str | None
    path: str | None
    package: str | None
    mode: int | None
    pid: int | None
    comm: str | None
    has_diff: bool
    diff: str | None
    relevance: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalEntry:
    """One journal line near a failure.

    Fields:
        timestamp_usec: __REALTIME_TIMESTAMP.
        priority: Syslog priority, 0 (emerg) to 7 (debug).
        message: MESSAGE, capped in length.
        unit: _SYSTEMD_UNIT, or UNIT for systemd's own lines about the unit.
        pid: _PID, when set.
        cursor: __CURSOR, to continue from.
    """

    timestamp_usec: int
    priority: int
    message: str
    unit: str | None
    pid: int | None
    cursor: str


class UnitContext(TypedDict):
    unit: str
    failure_usec: int
    invocation_id: str | None
    events: list[Event]
    journal: list[JournalEntry]
    journal_error: str | None
    dropped_events: int


class StatusResult(TypedDict):
    events: int
    ring_size: int
    dropped_events: int
    queue_overflows: int
    skipped_lines: int
    watched_paths: list[str]
    shadow_bytes: int
    fanotify: bool


class UnitNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No such unit is known: no unit file, no event and no journal line
    names it.

    Parameters:
        unit: The unit asked for.
    """

    class Parameters:
        unit: str


class InvalidUnitName(TypedVarlinkErrorReply, interface=NAME):
    """Not a valid systemd unit name.

    Parameters:
        unit: The name given.
    """

    class Parameters:
        unit: str


class InvalidWindow(TypedVarlinkErrorReply, interface=NAME):
    """A time window that is negative or larger than the retention.

    Parameters:
        window_usec: The window given.
        max_usec: The largest window accepted.
    """

    class Parameters:
        window_usec: int
        max_usec: int


class EventNotFound(TypedVarlinkErrorReply, interface=NAME):
    """The event is not (or no longer) in the timeline.

    Parameters:
        id: The event asked for.
    """

    class Parameters:
        id: int


class Context1(Interface, name=NAME):
    """What changed on this host: unit-file diffs, package history, kernel
    events and journal slices around a failure, as one timeline.

    Bad parameters other than those with their own error (a negative time,
    an unknown kind, a malformed invocation id, a limit out of range) answer
    org.varlink.service.InvalidParameter naming the parameter."""

    errors = (UnitNotFound, InvalidUnitName, InvalidWindow, EventNotFound)

    @method
    def GetUnitContext(
        self,
        *,
        unit: str,
        window_usec: int | None = None,
        failure_usec: int | None = None,
        invocation_id: str | None = None,
        include_diffs: bool | None = None,
        limit: int | None = None,
    ) -> UnitContext:
        """Everything that may explain a unit's failure, ranked: the journal
        around the failure, changes to the unit's file, its drop-ins and the
        files it references, package changes that shipped or touched them,
        and kernel events of the window.

        Parameters:
            unit: The unit, e.g. nginx.service.
            window_usec: How far back from the failure to look; the configured
                default when null; at most the retention.
            failure_usec: When it failed; when null, the unit's latest failure
                in the journal, else now.
            invocation_id: The failed invocation (32 hex digits), to slice its
                journal exactly.
            include_diffs: Include full diffs, not only summaries.
            limit: At most this many events (default 50, at most 1000).

        Returns:
            unit: The unit.
            failure_usec: The failure time the answer is centred on.
            invocation_id: The failed invocation, when known.
            events: Config, package and kernel events, most relevant first.
            journal: The journal lines around the failure, oldest first.
            journal_error: Why the journal slice is missing, when it is.
            dropped_events: Events lost to overload since start.
        """

    @method(return_parameter="events")
    def ListEvents(
        self,
        *,
        since_usec: int | None = None,
        kind: str | None = None,
        limit: int | None = None,
        after_id: int | None = None,
    ) -> list[Event]:
        """The timeline, newest last, without diffs.

        Parameters:
            since_usec: Only events that happened after this time.
            kind: Only events of this kind (unit_file, dropin, config, package,
                kernel).
            limit: At most this many, the newest (default 1000, at most 10000).
            after_id: Only events recorded after this one (ids grow as events
                are recorded; events read from logs carry the logs' older
                times, so a client following the timeline should use this).

        Returns:
            events: The events.
        """

    @method(return_parameter="event")
    def GetEvent(self, *, id: int) -> Event:
        """One event with its full diff.

        Parameters:
            id: The event.

        Returns:
            event: The event.
        """

    @method
    def GetStatus(self) -> StatusResult:
        """What contextd watches and how full its timeline is.

        Returns:
            events: Events in the timeline.
            ring_size: The most events the timeline keeps.
            dropped_events: Events lost to overload since start.
            queue_overflows: Times the kernel's inotify queue overflowed.
            skipped_lines: Log and journal lines in unexpected formats, skipped.
            watched_paths: Directories watched.
            shadow_bytes: Bytes of file content kept to diff against.
            fanotify: Whether fanotify tells the writing process.
        """
