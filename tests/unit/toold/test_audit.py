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
        def change(c: sqlite3.Connection, s: str = statement) -> sqlite3.Cursor:
            return c.execute(s)
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            audit.run_sync(change)
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


def test_a_prepare_that_fails_unexpectedly_leaves_the_unit_free_and_is_audited(
        tmp_path: Path) -> None:
    """A drop-in directory that vanished mid-check raised FileNotFoundError
    out of prepare: the unit stayed busy until toold restarted. Now it is a
    declared UnsafePath refusal, audited, and the next call is not UnitBusy."""
    from syntrop.interfaces.tool import UnitBusy, UnsafePath
    from syntrop.varlink.peer import Peer, reset_current, set_current

    tool = service(tmp_path, RateLimit(per_unit=50, per_unit_window=60, total=50,
                                       total_window=60))
    restart = tool.tools["unit_restart"]
    calls = []

    async def vanishing(args: object, context: object) -> object:
        calls.append(args)
        raise FileNotFoundError(2, "No such file or directory", "/etc/systemd/system/a.service.d")

    restart.prepare = vanishing  # type: ignore[method-assign,assignment]

    async def go() -> list[str]:
        token = set_current(Peer(pid=1, uid=0, gid=0))
        try:
            got = []
            for _ in range(2):
                try:
                    await tool._execute("unit_restart", {"unit": "a.service"}, False)
                except (UnsafePath, UnitBusy) as error:
                    got.append(type(error).__name__)
            return got
        finally:
            reset_current(token)

    assert asyncio.run(go()) == ["UnsafePath", "UnsafePath"]
    assert len(calls) == 2 and tool.busy == set()
    rows = asyncio.run(tool.audit.rows(limit=2))
    assert [(r.decision, r.error) for r in rows] == [("refused", "io.syntrop.Tool1.UnsafePath")] * 2
    asyncio.run(tool.aclose())


def test_an_intent_without_an_outcome_is_the_interrupted_revert(tmp_path: Path) -> None:
    """toold killed between writing a revert and finishing it leaves an
    intent with no outcome; once another action closes it, it is gone."""
    audit = Audit(tmp_path / "a.db")
    directory = "/etc/systemd/system/a.service.d"

    async def go() -> list[object]:
        seen: list[object] = []
        first = await audit.request(now_usec=1, uid=0, pid=1, tool="revert_dropin",
                                    unit="a.service", parameters={}, dry_run=False,
                                    decision="allowed")
        seen.append(await audit.interrupted(directory))
        await audit.intend(action_id=first, directory=directory,
                           target=[{"name": "10-good.conf"}])
        seen.append(await audit.interrupted(directory))
        seen.append(await audit.interrupted("/etc/systemd/system/b.service.d"))
        await audit.outcome(first, now_usec=2, sandbox=[], outcome="interrupted",
                            message="finished by action 2")
        seen.append(await audit.interrupted(directory))
        return seen

    assert asyncio.run(go()) == [None, (1, [{"name": "10-good.conf"}]), None, None]
    audit.close()
