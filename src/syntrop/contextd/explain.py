"""GetUnitContext's answer, assembled: the journal slice around the
failure (in a thread: journalctl is a subprocess), the packages that concern
the unit (in a thread: dpkg's lists), then the ranked events of the window."""

import asyncio
from dataclasses import dataclass

from syntrop.contextd import journal
from syntrop.contextd.recorder import Recorder
from syntrop.contextd.timeline import Record
from syntrop.system import journal as journalctl


@dataclass(slots=True, kw_only=True)
class Explanation:
    failure_usec: int
    invocation_id: str | None
    events: list[tuple[Record, float]]
    lines: list[journal.Line]
    journal_error: str | None
    known: bool


async def explain(recorder: Recorder, unit: str, *, window_usec: int, failure_usec: int | None,
                  invocation_id: str | None, limit: int) -> Explanation:
    """The journal slice around the unit's failure and the ranked events of
    the window before it (and shortly after)."""
    config = recorder.config
    await recorder.kernel_feed.poll()
    now = recorder.clock()
    if config.journal.journalctl:
        found = await asyncio.to_thread(
            journal.slice_unit, config.journal,
            lambda argv, count: journalctl.read(argv, limit=count), unit,
            failure_usec=failure_usec, invocation_id=invocation_id, before=config.lines_before,
            after=config.lines_after, after_usec=config.after_usec, now_usec=now)
    else:
        found = journal.Slice(failure_usec=failure_usec if failure_usec is not None else now,
                              invocation_id=invocation_id,
                              error="the journal is turned off by configuration")
    recorder.counters.skipped += found.skipped
    since = max(0, found.failure_usec - window_usec)
    until = found.failure_usec + config.after_usec
    specs = recorder.package_names(since, until)
    recorder.packages.refresh()  # one stat of dpkg's info directory
    if specs and not recorder.packages.cached(specs):
        owners = await asyncio.to_thread(recorder.owners, unit, specs)
    else:
        owners = recorder.owners(unit, specs)  # from memory: no thread needed
    pids = {line.pid for line in found.lines if line.pid is not None and line.pid > 1}
    ranked = recorder.context(unit, failure_usec=found.failure_usec, since_usec=since,
                              until_usec=until, pids=pids, owners=owners, limit=limit)
    return Explanation(failure_usec=found.failure_usec, invocation_id=found.invocation_id,
                       events=ranked, lines=found.lines, journal_error=found.error,
                       known=bool(ranked or found.lines) or recorder.known(unit))
