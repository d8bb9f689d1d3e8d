"""systemd-sentry under a real systemd, with every daemon from units/: real
JobRemoved / PropertiesChanged signals, contextd's history, toold's actions.
runtimed has no model here, so every decision is the rules' and the
incidents say decided_by=rules.

Scenarios: a bad drop-in edit is reverted; a transient crash is restarted;
a crash loop gets one restart, then is left to a human (a crash loop with
nothing changed is a cause no tool removes) and nothing more is done; a
unit on the ignore list is left alone."""

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.system.instance import Instance, wait_until

NAME = "io.syntrop.Sentry1"
CONTEXT = "io.syntrop.Context1"
SENTRY_CONFIG = """\
ignore = ["sentry-ignored.service"]
[breaker]
cap = 2
base_sec = 1
max_sec = 1
window_sec = 600
"""
TOOLD_CONFIG = "[timeouts]\nhealth_window_sec = 2\njob_sec = 20\n"


def call(instance: Instance, method: str, interface: str = NAME, **params: Any) -> Any:
    return instance.call(interface, method, **params)



@pytest.fixture(scope="module")
def sentry(instance: Instance) -> Iterator[Instance]:
    instance.write("/etc/syntrop/sentry.toml", SENTRY_CONFIG)
    instance.write("/etc/syntrop/toold.toml", TOOLD_CONFIG)
    instance.systemctl("stop", "toold.service", "systemd-sentry.service", check=False)
    call(instance, "GetStatus", interface=CONTEXT)  # contextd watching before any edit
    instance.systemctl("start", "systemd-sentry.service")
    instance.wait_for_unit("systemd-sentry.service", ActiveState="active")
    status = call(instance, "GetStatus")
    assert status["subscribed"] is True, status
    yield instance
    instance.systemctl("stop", "systemd-sentry.service", check=False)
    instance.run(["rm", "-f", "/etc/syntrop/sentry.toml", "/etc/syntrop/toold.toml"],
                 check=False)


def install(instance: Instance, unit: str, exec_start: str) -> None:
    instance.write(f"/etc/systemd/system/{unit}",
                   f"[Unit]\nDescription=sentry probe\n[Service]\nType=exec\n"
                   f"ExecStart={exec_start}\n")
    instance.systemctl("daemon-reload")


def finished(instance: Instance, unit: str, count: int) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]]:
        incidents = call(instance, "ListIncidents", unit=unit)["incidents"]
        ended = [i for i in incidents if i["result"] != "in_progress"]
        return ended if len(ended) >= count else []

    return wait_until(f"{count} finished incidents of {unit}", done, 60, interval=0.2)


def report(incident: dict[str, Any]) -> None:
    """The scenario's figures, printed for docs/sentry.md (pytest -s)."""
    phases = ", ".join(f"{p['name']} {p['outcome']} {p['duration_usec'] / 1000:.1f} ms"
                       for p in incident["phases"])
    decide = [p["detail"] for p in incident["phases"] if p["name"] == "decide"]
    ends = [p["started_usec"] + p["duration_usec"] for p in incident["phases"]
            if p["name"] == "execute" and p["outcome"] == "ok"]
    healed = f"{(ends[0] - incident['detected_usec']) / 1e6:.2f} s" if ends else "-"
    print(f"\n{incident['summary']}: {phases}; decide: {decide}; failure → action done {healed}")


def tools(incidents: list[dict[str, Any]]) -> list[str | None]:
    return [json.loads(i["decision"])["tool"] if i.get("decision") else None for i in incidents]


def test_sentry_reverts_a_bad_dropin(sentry: Instance) -> None:
    unit = "sentry-dropin.service"
    install(sentry, unit, "/bin/sleep infinity")
    sentry.systemctl("start", unit)
    path = f"/etc/systemd/system/{unit}.d/50-bad.conf"
    sentry.write(path, "[Service]\nExecStart=\nExecStart=/bin/sh -c 'exit 3'\n")

    def seen() -> bool:
        events = call(sentry, "ListEvents", interface=CONTEXT, kind="dropin")["events"]
        return any(e.get("path") == path for e in events)

    wait_until("contextd recorded the drop-in", seen, 10)
    sentry.systemctl("daemon-reload")
    sentry.systemctl("restart", unit, check=False)
    [incident] = finished(sentry, unit, 1)
    report(incident)
    assert incident["decided_by"] == "rules", incident
    assert tools([incident]) == ["revert_dropin"]
    assert incident["result"] == "healed", incident
    sentry.wait_for_unit(unit, ActiveState="active")
    assert not sentry.host_path(path).exists()


def test_sentry_restarts_a_transient_crash(sentry: Instance) -> None:
    unit = "sentry-crash.service"
    marker = "/run/sentry-crash-once"
    install(sentry, unit, f"/bin/sh -c 'test -e {marker} && exec sleep infinity; "
                          f"sleep 0.5; exit 1'")
    sentry.run(["rm", "-f", marker])
    sentry.systemctl("start", unit)
    sentry.run(["touch", marker])  # the next start is healthy
    [incident] = finished(sentry, unit, 1)
    report(incident)
    assert incident["trigger"] == "state_failed", incident
    assert tools([incident]) == ["unit_restart"]
    assert incident["result"] == "healed", incident
    sentry.wait_for_unit(unit, ActiveState="active")


def test_sentry_a_new_unit_failing_at_once_gets_one_restart_then_a_human(
        sentry: Instance) -> None:
    """Installed and started, it dies at once every time: its new unit file
    is the change the failure follows, and no tool undoes an admin's unit
    file, so one restart, then a human (test_sentry_plans.py has a crash
    loop of a unit that ran well first)."""
    unit = "sentry-loop.service"
    install(sentry, unit, "/bin/sh -c 'sleep 0.3; exit 1'")
    sentry.systemctl("start", unit)

    def needs_human() -> bool:
        breakers = call(sentry, "GetStatus")["breakers"]
        return any(b["unit"] == unit and b["state"] == "needs_human" for b in breakers)

    wait_until("the breaker needs a human", needs_human, 60, interval=0.2)
    [incident] = finished(sentry, unit, 1)
    report(incident)
    assert (incident["cause"]["kind"], incident["cause"]["fixable"]) == \
        ("unit_file_changed", False), incident
    assert tools([incident]) == ["unit_restart"] and incident["result"] == "needs_human"
    sentry.wait_for_unit(unit, ActiveState="failed")
    # a human starts it again; it fails; sentry leaves it alone
    sentry.systemctl("start", unit)
    sentry.wait_for_unit(unit, ActiveState="failed")
    finished(sentry, unit, 2)
    time.sleep(1)  # systemd repeats a failed unit's properties: still one incident
    later = finished(sentry, unit, 2)  # oldest first
    report(later[-1])
    assert [i["result"] for i in later] == ["needs_human", "breaker_open"], later
    assert later[-1].get("decision") is None


def test_sentry_leaves_an_ignored_unit_alone(sentry: Instance) -> None:
    unit = "sentry-ignored.service"
    install(sentry, unit, "/bin/sh -c 'sleep 0.3; exit 1'")
    sentry.systemctl("start", unit)
    sentry.wait_for_unit(unit, ActiveState="failed")
    # sentry reacts within tens of milliseconds (the other scenarios); give it 3 s
    time.sleep(3)
    assert call(sentry, "ListIncidents", unit=unit)["incidents"] == []
    assert sentry.show(unit, "ActiveState", "NRestarts") == {
        "ActiveState": "failed", "NRestarts": "0"}
