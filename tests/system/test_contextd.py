"""contextd under a real systemd: the installed, sandboxed contextd.service
watches the instance's real unit directories and reads its real journal.

The acceptance scenario of contextd's issue: a unit's drop-in is edited,
systemd reloaded, the unit started so that it fails; GetUnitContext then
answers with the drop-in's diff, the failure's journal lines, and nothing
unrelated ranked above them."""

from collections.abc import Iterator
from typing import Any

import pytest
import varlink

from tests.system.instance import NOBODY, Instance, call_as, wait_until

NAME = "io.syntrop.Context1"
UNIT = "syntrop-ctx-probe.service"
UNRELATED = "syntrop-ctx-bystander.service"
DROPIN = f"/etc/systemd/system/{UNIT}.d/50-tuning.conf"
BROKEN = "ExecStart=/bin/sh -c 'echo probe: broken by the drop-in >&2; exit 3'"


def call(instance: Instance, method: str, **params: Any) -> Any:
    address = f"unix:{instance.host_path(f'/run/syntrop/{NAME}')}"
    with varlink.Client(address=address) as client, client.open(NAME) as proxy:
        return getattr(proxy, method)(**params)


@pytest.fixture
def probe_units(instance: Instance) -> Iterator[None]:
    """A unit that works, with a drop-in; removed afterwards."""
    instance.write(f"/etc/systemd/system/{UNIT}",
                   "[Unit]\nDescription=contextd probe\n[Service]\nType=oneshot\n"
                   "ExecStart=/bin/echo probe ran fine\n")
    instance.write(DROPIN, "[Service]\nEnvironment=PROBE_MODE=tuned\n")
    instance.systemctl("daemon-reload")
    instance.systemctl("start", UNIT)
    try:
        yield
    finally:
        instance.run(["rm", "-rf", f"/etc/systemd/system/{UNIT}", f"/etc/systemd/system/{UNIT}.d",
                      f"/etc/systemd/system/{UNRELATED}"], check=False)
        instance.systemctl("daemon-reload", check=False)
        instance.systemctl("reset-failed", UNIT, check=False)


def _events_about(instance: Instance, path: str) -> list[dict[str, Any]]:
    return [e for e in call(instance, "ListEvents")["events"] if e.get("path") == path]


def test_a_broken_dropin_is_what_contextd_names(instance: Instance, probe_units: None) -> None:
    # contextd is up (socket activation) and watching before the edit.
    status = call(instance, "GetStatus")
    assert "/etc/systemd/system" in status["watched_paths"]
    assert f"/etc/systemd/system/{UNIT}.d" in status["watched_paths"]
    # Someone edits the drop-in: the unit's command is replaced.
    instance.write(DROPIN, f"[Service]\nEnvironment=PROBE_MODE=tuned\nExecStart=\n{BROKEN}\n")
    wait_until("contextd recorded the edit", lambda: [
        e for e in _events_about(instance, DROPIN) if e["action"] == "modified"], 10)
    # Something unrelated changes later still, closer to the failure.
    instance.write(f"/etc/systemd/system/{UNRELATED}",
                   "[Service]\nExecStart=/bin/true\n")
    instance.systemctl("daemon-reload")
    started = instance.run(["systemctl", "start", UNIT], check=False)
    assert started.returncode != 0, "the broken unit started"
    shown = instance.wait_for_unit(UNIT, ActiveState="failed")
    invocation = instance.show(UNIT, "InvocationID")["InvocationID"]
    assert shown["ActiveState"] == "failed"

    def answer() -> dict[str, Any] | None:
        context = call(instance, "GetUnitContext", unit=UNIT, include_diffs=True)
        lines = [line["message"] for line in context["journal"]]
        return context if any("Failed with result" in m for m in lines) else None

    context = wait_until("the failure in contextd's journal slice", answer, 15)

    # The journal: the unit's own error line and systemd's verdict, this
    # invocation's.
    lines = [line["message"] for line in context["journal"]]
    assert any("probe: broken by the drop-in" in m for m in lines), lines
    assert any("Failed with result 'exit-code'" in m for m in lines), lines
    assert context["invocation_id"] == invocation
    assert not any("bystander" in m for m in lines)

    # The events: the drop-in's diff first; nothing unrelated at all.
    ranked = context["events"]
    assert ranked, "no events"
    first = ranked[0]
    assert first.get("path") == DROPIN, [e["summary"] for e in ranked]
    assert first["kind"] == "dropin" and first["unit"] == UNIT
    assert first["action"] == "modified"
    assert f" Environment=PROBE_MODE=tuned\n+ExecStart=\n+{BROKEN}\n" in first["diff"]
    assert BROKEN in first["summary"]
    assert all(e["relevance"] <= first["relevance"] for e in ranked)
    assert not any(UNRELATED in (e.get("path") or "") for e in ranked), \
        [e["summary"] for e in ranked]
    # Under the unit's sandbox (no CAP_SYS_ADMIN) fanotify is off: no writer.
    assert call(instance, "GetStatus")["fanotify"] is False
    assert "pid" not in first

    # Another uid gets the same events but none of the unit's journal
    # lines (the unit is root's), and why.
    stranger = call_as(instance, NOBODY, NAME, "GetUnitContext", unit=UNIT)["parameters"]
    assert stranger["journal"] == [] and "systemd-journal" in stranger["journal_error"]
    assert [e["id"] for e in stranger["events"]] == [e["id"] for e in ranked]
