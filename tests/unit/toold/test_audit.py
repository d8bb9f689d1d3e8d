"""The audit log: append-only, interrupted actions shown, rate limits counted
from it (so they survive toold exiting on idle)."""

import asyncio
import sqlite3
from pathlib import Path

import pytest

from syntrop.config import Paths
from syntrop.toold import errors
from syntrop.toold.audit import Audit
from syntrop.toold.config import RateLimit, parse
from syntrop.toold.context import now_usec
from syntrop.toold.service import ToolService


def test_the_log_is_append_only(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "toold.db")

    async def go() -> None:
        action = await audit.request(now_usec=1, uid=0, pid=1, tool="daemon_reload", unit=None,
                                     parameters={}, dry_run=False, decision="allowed")
        await audit.outcome(action, now_usec=2, sandbox=[], outcome="succeeded", message="ok")
        await audit.snapshot(action_id=action, unit="a.service", directory="/x", now_usec=3,
                             entries=[])

    asyncio.run(go())
    for statement in ("UPDATE requests SET uid = 5", "DELETE FROM requests",
                      "UPDATE outcomes SET outcome = 'x'", "DELETE FROM outcomes",
                      "DELETE FROM snapshots"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            audit.run_sync(lambda c, s=statement: c.execute(s))
    audit.close()
    # and after a restart, the same
    again = Audit(tmp_path / "toold.db")
    rows = asyncio.run(again.rows(limit=10))
    assert [(r.tool, r.outcome) for r in rows] == [("daemon_reload", "succeeded")]
    again.close()


def test_an_action_without_outcome_reads_as_interrupted(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "toold.db")
    asyncio.run(audit.request(now_usec=1, uid=0, pid=1, tool="unit_restart", unit="a.service",
                              parameters={"unit": "a.service"}, dry_run=False,
                              decision="allowed"))
    [row] = asyncio.run(audit.rows(limit=1))
    assert row.outcome == "interrupted" and row.finished_usec is None
    audit.close()


def test_huge_parameters_are_capped(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "toold.db")
    asyncio.run(audit.request(now_usec=1, uid=0, pid=1, tool="x", unit=None,
                              parameters={"a": "b" * 100_000}, dry_run=True, decision="refused"))
    [row] = asyncio.run(audit.rows(limit=1))
    assert len(str(row.parameters)) < 5000
    audit.close()


def service(tmp_path: Path, rate: RateLimit) -> ToolService:
    paths = Paths(runtime=tmp_path / "run", state=tmp_path / "state", cache=tmp_path / "cache",
                  configuration=tmp_path / "config")
    config = parse({})
    from dataclasses import replace
    return ToolService(paths, replace(config, rate=rate))


def test_rate_limits_per_unit_and_global(tmp_path: Path) -> None:
    tool = service(tmp_path, RateLimit(per_unit=2, per_unit_window=60, total=3, total_window=60))

    async def allowed(unit: str, *, dry_run: bool = False) -> None:
        await tool.audit.request(now_usec=now_usec(), uid=0, pid=1, tool="unit_restart",
                                 unit=unit, parameters={}, dry_run=dry_run, decision="allowed")

    async def go() -> None:
        await tool._rate_check("a.service")
        await allowed("a.service")
        await allowed("a.service", dry_run=True)  # dry runs do not count
        await tool._rate_check("a.service")
        await allowed("a.service")
        with pytest.raises(errors.Limited) as caught:
            await tool._rate_check("a.service")
        assert caught.value.fields["unit"] == "a.service"
        assert 0 < int(caught.value.fields["retry_after_usec"]) <= 60_000_000  # type: ignore[call-overload]
        await tool._rate_check("b.service")
        await allowed("b.service")
        with pytest.raises(errors.Limited) as caught:
            await tool._rate_check("c.service")
        assert caught.value.fields["unit"] == ""

    asyncio.run(go())
    asyncio.run(tool.aclose())


def test_old_actions_fall_out_of_the_window(tmp_path: Path) -> None:
    tool = service(tmp_path, RateLimit(per_unit=1, per_unit_window=1, total=10, total_window=1))

    async def go() -> None:
        await tool.audit.request(now_usec=now_usec() - 2_000_000, uid=0, pid=1, tool="x",
                                 unit="a.service", parameters={}, dry_run=False,
                                 decision="allowed")
        await tool._rate_check("a.service")

    asyncio.run(go())
    asyncio.run(tool.aclose())
