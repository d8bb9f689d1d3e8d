"""io.syntrop.Context1: what changed, as one timeline (contextd)."""

from dataclasses import dataclass
from typing import TypedDict

from asyncvarlink import TypedVarlinkErrorReply

from syntrop.varlink.contract import Interface, method

NAME = "io.syntrop.Context1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One change on the host.

    Fields:
        id: Sequence number in the timeline.
        timestamp_usec: When it happened, microseconds since the epoch.
        kind: unit_file, dropin, package, kernel or journal.
        summary: One line suitable for an LLM prompt.
        unit: The unit it concerns, when known.
        path: The file changed, for file events.
        package: The package, for package events.
        pid: The writing process, when fanotify could tell.
        comm: The writing process's name, when known.
        diff: Unified diff before → after; only when asked for.
        relevance: Rank within a GetUnitContext answer, higher first.
    """

    id: int
    timestamp_usec: int
    kind: str
    summary: str
    unit: str | None
    path: str | None
    package: str | None
    pid: int | None
    comm: str | None
    diff: str | None
    relevance: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalEntry:
    """One journal line near a failure.

    Fields:
        timestamp_usec: __REALTIME_TIMESTAMP.
        priority: Syslog priority, 0 (emerg) to 7 (debug).
        message: MESSAGE.
        unit: _SYSTEMD_UNIT, when set.
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
    events: list[Event]
    journal: list[JournalEntry]
    dropped_events: int


class StatusResult(TypedDict):
    events: int
    dropped_events: int
    watched_paths: list[str]
    fanotify: bool


class UnitNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No such unit is known.

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
    events and journal slices around a failure, as one timeline."""

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
    ) -> UnitContext:
        """Everything that may explain a unit's failure, ranked.

        Parameters:
            unit: The unit, e.g. nginx.service.
            window_usec: How far back to look; the configured default when null.
            failure_usec: When it failed; now when null.
            invocation_id: The failed invocation, to slice its journal exactly.
            include_diffs: Include full diffs, not only summaries.

        Returns:
            unit: The unit.
            events: Config, package and kernel events, most relevant first.
            journal: The journal lines around the failure.
            dropped_events: Events lost to overload since start.
        """

    @method(return_parameter="events")
    def ListEvents(
        self,
        *,
        since_usec: int | None = None,
        kind: str | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """The timeline, newest last.

        Parameters:
            since_usec: Only events after this time.
            kind: Only events of this kind.
            limit: At most this many (the newest).

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
            dropped_events: Events lost to overload since start.
            watched_paths: Directories watched.
            fanotify: Whether fanotify tells the writing process.
        """
