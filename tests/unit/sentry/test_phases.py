"""phases.Live.context: what one missing source does to the others."""

import asyncio

from syntrop.sentry.findings import UnitFacts
from syntrop.sentry.phases import Live


def test_systemds_view_survives_a_timeline_that_could_not_be_read() -> None:
    live = Live(systemd=None, model="smollm2")

    async def timeline(unit: str, failure_usec: int) -> object:
        raise ConnectionResetError("contextd went away")

    async def facts(unit: str) -> UnitFacts:
        return UnitFacts(unit=unit, need_daemon_reload=True)

    async def tools() -> list[str]:
        return ["daemon_reload", "unit_restart"]

    live._timeline = timeline  # type: ignore[method-assign,assignment]
    live.unit_facts = facts  # type: ignore[method-assign]
    live._tools = tools  # type: ignore[method-assign]
    got = asyncio.run(live.context("a.service", 1_000))
    assert got.unit is not None and got.unit.need_daemon_reload
    assert got.tools == ("daemon_reload", "unit_restart")
    assert got.changes == [] and got.failure_usec == 1_000
    assert got.unread == ("contextd's timeline: ConnectionResetError: contextd went away",)
    assert "not read: contextd's timeline" in got.summary
