"""Journal micro-slices: the lines of one unit (or one invocation) just
before and after its failure, read with time seeks, never a scan.

`journalctl --reverse --until=@T` starts at T (a bisection of the entry
arrays) and walks back, `--since=@T` walks forward from it; we stop reading
after the lines we want. With the
failure time unknown, the walk starts at the newest entry of the unit and the
first failure marker met is the failure: systemd's "Failed with result"
(MESSAGE_ID d9b373ed…, UNIT_RESULT=; not the job's "Failed to start", which
follows it); when none is among the newest lines, the journal's index is asked
for the latest such line (a field match, however far back); else the newest line at priority err
or worse, else now.

The reader is passed in (syntrop.system.journal.read in the daemon, a fake
in unit tests), so this module is pure logic.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from syntrop.system.journal import Result, Source

#: systemd's SD_MESSAGE_UNIT_FAILURE_RESULT.
FAILURE_MESSAGE_ID = "d9b373ed55a64feb8242e02dbe79a49c"
MAX_MESSAGE = 4096
_INVOCATION = re.compile(r"^[0-9a-f]{32}$")

Reader = Callable[[Sequence[str], int], Result]


@dataclass(frozen=True, slots=True, kw_only=True)
class Line:
    timestamp_usec: int
    priority: int
    message: str
    unit: str | None
    pid: int | None
    cursor: str
    invocation_id: str | None = None
    failure_marker: bool = False
    #: Who wrote it, as journald recorded (_UID), and the user whose
    #: session or unit it came from (_SYSTEMD_OWNER_UID); None when absent.
    uid: int | None = None
    owner_uid: int | None = None


@dataclass(slots=True, kw_only=True)
class Slice:
    lines: list[Line] = field(default_factory=list)
    failure_usec: int = 0
    invocation_id: str | None = None
    error: str | None = None
    skipped: int = 0


def is_invocation_id(value: str) -> bool:
    return _INVOCATION.match(value) is not None


def text(value: Any) -> str:
    """A journal field as JSON gives it: a string, bytes as a list of
    numbers (not UTF-8), or a list of those (a repeated field: the first)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(b, int) for b in value):
        return bytes(b & 0xFF for b in value).decode("utf-8", "replace")
    if isinstance(value, list) and value:
        return text(value[0])
    return ""


def _int(value: Any) -> int | None:
    try:
        return int(text(value))
    except ValueError:
        return None


def line_of(raw: dict[str, Any]) -> Line | None:
    """A journal entry as a Line; None without a usable timestamp or cursor."""
    stamp = _int(raw.get("__REALTIME_TIMESTAMP"))
    cursor = text(raw.get("__CURSOR"))
    if stamp is None or not cursor:
        return None
    priority = _int(raw.get("PRIORITY"))
    message = text(raw.get("MESSAGE"))
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    unit = text(raw.get("_SYSTEMD_UNIT")) or None
    if text(raw.get("_PID")) == "1" and text(raw.get("UNIT")):
        unit = text(raw.get("UNIT"))  # systemd's own line about the unit
    invocation = text(raw.get("_SYSTEMD_INVOCATION_ID")) or text(raw.get("INVOCATION_ID"))
    marker = text(raw.get("MESSAGE_ID")) == FAILURE_MESSAGE_ID or bool(raw.get("UNIT_RESULT"))
    return Line(timestamp_usec=stamp, priority=priority if priority is not None else 6,
                message=message, unit=unit, pid=_int(raw.get("_PID")), cursor=cursor,
                invocation_id=invocation or None, failure_marker=marker,
                uid=_int(raw.get("_UID")), owner_uid=_int(raw.get("_SYSTEMD_OWNER_UID")))


def at(usec: int) -> str:
    return f"@{usec // 1_000_000}.{usec % 1_000_000:06d}"


def matches(unit: str, invocation_id: str | None) -> list[str]:
    if invocation_id is not None:
        return [f"_SYSTEMD_INVOCATION_ID={invocation_id}", "+", f"INVOCATION_ID={invocation_id}",
                "+", f"USER_INVOCATION_ID={invocation_id}"]
    return [f"--unit={unit}"]


def _lines(result: Result) -> tuple[list[Line], int]:
    lines, skipped = [], result.skipped
    for raw in result.entries:
        line = line_of(raw)
        if line is None:
            skipped += 1
        else:
            lines.append(line)
    return lines, skipped


def slice_unit(source: Source, read: Reader, unit: str, *, failure_usec: int | None,
               invocation_id: str | None, before: int, after: int, after_usec: int,
               now_usec: int, scan: int = 500) -> Slice:
    """The unit's journal around its failure (see the module docstring)."""
    found = Slice(failure_usec=failure_usec if failure_usec is not None else now_usec,
                  invocation_id=invocation_id)
    select = matches(unit, invocation_id)
    if failure_usec is None:
        result = read(source.argv("--reverse", *select), before + scan)
        newest_first, found.skipped = _lines(result)
        found.error = result.error
        anchor = next((i for i, line in enumerate(newest_first) if line.failure_marker), None)
        if anchor is None:
            # Not among the newest lines: ask the journal's index for the
            # unit's latest "Failed with result", however far back.
            marked = _latest_failure(source, read, unit, invocation_id)
            if marked is not None:
                exact = slice_unit(source, read, unit, failure_usec=marked.timestamp_usec,
                                   invocation_id=invocation_id, before=before, after=after,
                                   after_usec=after_usec, now_usec=now_usec)
                exact.invocation_id = exact.invocation_id or marked.invocation_id
                exact.skipped += found.skipped
                return exact
            anchor = next((i for i, line in enumerate(newest_first) if line.priority <= 3), None)
        if anchor is None:
            found.lines = newest_first[:before][::-1]
            return found
        failure = newest_first[anchor]
        found.failure_usec = failure.timestamp_usec
        found.invocation_id = found.invocation_id or failure.invocation_id
        newer = [line for line in newest_first[:anchor]
                 if line.timestamp_usec <= failure.timestamp_usec + after_usec]
        found.lines = newest_first[anchor:anchor + before][::-1] + newer[::-1][:after]
        return found
    # Two seeks: back from the failure for the lines before, forward from
    # it for the first lines after (a flood afterwards cannot crowd them out).
    result = read(source.argv("--reverse", f"--until={at(failure_usec)}", *select), before)
    earlier, found.skipped = _lines(result)
    found.error = result.error
    later: list[Line] = []
    if after > 0 and after_usec > 0:
        result = read(source.argv(f"--since={at(failure_usec + 1)}",
                                  f"--until={at(failure_usec + after_usec)}", *select), after)
        later, skipped = _lines(result)
        found.skipped += skipped
        found.error = found.error or result.error
    if found.invocation_id is None:
        marked = next((line for line in earlier if line.failure_marker), None)
        found.invocation_id = marked.invocation_id if marked else None
    found.lines = earlier[::-1] + later
    return found


def _latest_failure(source: Source, read: Reader, unit: str,
                    invocation_id: str | None) -> Line | None:
    """The newest failure-result line of the unit (or invocation): field
    matches, answered from the journal's hash tables."""
    which = f"INVOCATION_ID={invocation_id}" if invocation_id else f"UNIT={unit}"
    result = read(source.argv("--reverse", f"MESSAGE_ID={FAILURE_MESSAGE_ID}", "_PID=1", which), 1)
    lines, _ = _lines(result)
    return lines[0] if lines else None


def kernel_argv(source: Source, cursor: str | None, since_usec: int, *, follow: bool) -> list[str]:
    """journalctl arguments for kernel messages after `cursor` (else since
    `since_usec`), following when asked."""
    args = ["--dmesg"]
    args.append(f"--after-cursor={cursor}" if cursor else f"--since={at(since_usec)}")
    if follow:
        args += ["--follow", "--no-tail"]
    return source.argv(*args)
