"""toold under a real systemd: the installed, sandboxed toold.service acts on
real units of the instance over real D-Bus (Reload, RestartUnit, JobRemoved),
reads contextd's real history, and writes drop-ins through its bubblewrap +
Landlock + seccomp tool process.

The acceptance of toold's issue: a unit broken by a bad drop-in is repaired
by revert_dropin and is active afterwards; a revert that makes things worse
is rolled back automatically; unit_restart of a failed unit reports the job
result; an unauthorized uid is refused."""

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import declared_error
from tests.system.instance import NOBODY, Instance, call_as, wait_until

NAME = "io.syntrop.Tool1"
CONTEXT = "io.syntrop.Context1"
UNIT = "toolprobe.service"
ONESHOT = "toolprobe-oneshot.service"
CACHED = "toolprobe-cache.service"
DROPINS = f"/etc/systemd/system/{UNIT}.d"
CONFIG = """\
[timeouts]
health_window_sec = 2
job_sec = 20

[rate]
per_unit = 50
global = 200
"""
SERVICE = ("[Unit]\nDescription=toold probe\n[Service]\nType=exec\n"
           "ExecStart=/bin/sleep infinity\n")
BAD = "[Service]\nExecStart=\nExecStart=/bin/sh -c 'echo broken by a drop-in >&2; exit 3'\n"
GOOD = "[Service]\nEnvironment=SYNTROP_PROBE=fine\n"


def call(instance: Instance, method: str, interface: str = NAME, **params: Any) -> Any:
    return instance.call(interface, method, **params)


def execute(instance: Instance, tool: str, **parameters: Any) -> Any:
    return call(instance, "Execute", tool=tool, parameters=parameters, dry_run=False)


def error_of(instance: Instance, tool: str, **parameters: Any) -> tuple[str, dict[str, Any]]:
    return declared_error(execute, instance, tool, **parameters)



@pytest.fixture(scope="module")
def toold(instance: Instance) -> Iterator[Instance]:
    """toold configured for tests (short health window), contextd up."""
    instance.write("/etc/syntrop/toold.toml", CONFIG)
    instance.systemctl("stop", "toold.service", check=False)
    call(instance, "GetStatus", interface=CONTEXT)  # contextd watching before any edit
    yield instance
    instance.run(["rm", "-f", "/etc/syntrop/toold.toml"], check=False)
    instance.systemctl("stop", "toold.service", check=False)


@pytest.fixture
def probe(toold: Instance) -> Iterator[Instance]:
    toold.write(f"/etc/systemd/system/{UNIT}", SERVICE)
    toold.systemctl("daemon-reload")
    toold.systemctl("start", UNIT)
    toold.wait_for_unit(UNIT, ActiveState="active")
    try:
        yield toold
    finally:
        toold.systemctl("stop", UNIT, check=False)
        toold.run(["rm", "-rf", f"/etc/systemd/system/{UNIT}", DROPINS], check=False)
        toold.systemctl("daemon-reload", check=False)
        toold.systemctl("reset-failed", UNIT, check=False)


def _contextd_saw(instance: Instance, path: str, action: str) -> bool:
    events = call(instance, "ListEvents", interface=CONTEXT, kind="dropin")["events"]
    return any(e.get("path") == path and e.get("action") == action for e in events)


def _broken(probe: Instance) -> str:
    """The probe unit failed by a bad drop-in contextd has seen; its path."""
    path = f"{DROPINS}/50-bad.conf"
    probe.write(path, BAD)
    wait_until("contextd recorded the drop-in", lambda: _contextd_saw(probe, path, "created"), 10)
    probe.systemctl("daemon-reload")
    probe.systemctl("restart", UNIT, check=False)
    probe.wait_for_unit(UNIT, ActiveState="failed")
    return path


def test_revert_dropin_repairs_a_unit_broken_by_a_bad_dropin(probe: Instance) -> None:
    path = _broken(probe)

    dry = call(probe, "Execute", tool="revert_dropin", parameters={"unit": UNIT}, dry_run=True)
    assert dry["outcome"] == "not_run"
    assert any("remove 50-bad.conf" in step for step in dry["plan"]), dry["plan"]
    assert probe.host_path(path).exists(), "a dry run changed the drop-in"

    result = execute(probe, "revert_dropin", unit=UNIT)
    assert result["outcome"] == "succeeded", result
    assert result["active_state"] == "active"
    assert result["previous_active_state"] == "failed"
    assert result["rolled_back"] is False
    assert result["details"]["source"] == "contextd's history"
    assert result["sandbox"] == ["bubblewrap", "landlock", "seccomp"]
    assert not probe.host_path(path).exists()
    assert probe.show(UNIT, "ActiveState")["ActiveState"] == "active"

    record = call(probe, "GetAudit", unit=UNIT, limit=1)["records"][-1]
    assert record["id"] == result["action_id"]
    assert (record["decision"], record["outcome"]) == ("allowed", "succeeded")
    assert record["sandbox"] == ["bubblewrap", "landlock", "seccomp"]
    assert record["details"]["snapshot_id"] > 0


def test_a_revert_toold_is_killed_in_is_finished_not_undone(probe: Instance) -> None:
    """toold killed -9 after a revert wrote the drop-ins, before it finished:
    the next revert_dropin finishes it (reload, restart, watch) instead of
    taking toold's own write for the change to undo and writing the bad
    drop-in back."""
    path = _broken(probe)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(execute, probe, "revert_dropin", unit=UNIT)
        # The write is done once the drop-in is gone; toold then restarts
        # the unit and watches it for its health window (2 s here).
        wait_until("the revert wrote", lambda: not probe.host_path(path).exists(), 20)
        probe.systemctl("kill", "--signal=KILL", "toold.service")
        with pytest.raises(Exception):  # noqa: B017 - the connection is lost, however it shows
            first.result(timeout=30)
    probe.systemctl("reset-failed", "toold.service", check=False)  # no start limit left over

    again = execute(probe, "revert_dropin", unit=UNIT)
    assert again["outcome"] == "succeeded", again
    assert "stopped in" in again["details"]["source"], again["details"]
    assert not probe.host_path(path).exists(), "the bad drop-in was written back"
    assert probe.show(UNIT, "ActiveState")["ActiveState"] == "active"
    records = call(probe, "GetAudit", unit=UNIT, limit=2)["records"]
    assert [r["outcome"] for r in records] == ["interrupted", "succeeded"], records
    assert f"action {again['action_id']} finishes it" in records[0]["message"]


def test_a_revert_that_makes_things_worse_is_rolled_back(probe: Instance) -> None:
    path = f"{DROPINS}/50-edit.conf"
    probe.write(path, BAD)  # version 1: breaks the unit (never applied)
    wait_until("contextd saw version 1", lambda: _contextd_saw(probe, path, "created"), 10)
    time.sleep(2.5)  # a separate change, not the same burst of edits
    probe.write(path, GOOD)  # version 2: fine
    wait_until("contextd saw version 2", lambda: _contextd_saw(probe, path, "modified"), 10)
    probe.systemctl("daemon-reload")
    probe.systemctl("restart", UNIT)
    probe.wait_for_unit(UNIT, ActiveState="active")

    result = execute(probe, "revert_dropin", unit=UNIT)
    assert result["outcome"] == "rolled_back", result
    assert result["rolled_back"] is True
    assert result["details"]["state_after_revert"] == "failed"
    assert result["active_state"] == "active"
    assert probe.host_path(path).read_text() == GOOD
    assert probe.show(UNIT, "ActiveState")["ActiveState"] == "active"
    record = call(probe, "GetAudit", unit=UNIT, limit=1)["records"][-1]
    assert (record["outcome"], record["rolled_back"]) == ("rolled_back", True)


CONFIGURED = "toolprobe-conf.service"
ENV = "/etc/toolprobe-conf/app.env"
PROGRAM = "/usr/local/bin/toolprobe-conf"


@pytest.fixture
def configured(toold: Instance) -> Iterator[Instance]:
    """A service reading MODE from its EnvironmentFile= under /etc, active
    with MODE=good, contextd watching the file."""
    toold.write(ENV, "MODE=good\n")
    toold.write(PROGRAM, '#!/bin/sh\n[ "$MODE" = good ] || '
                         '{ echo "MODE=$MODE is not good" >&2; exit 2; }\nexec sleep infinity\n')
    toold.run(["chmod", "0755", PROGRAM])
    toold.write(f"/etc/systemd/system/{CONFIGURED}",
                f"[Service]\nType=exec\nEnvironmentFile={ENV}\nExecStart={PROGRAM}\n")
    toold.systemctl("daemon-reload")
    toold.systemctl("start", CONFIGURED)
    toold.wait_for_unit(CONFIGURED, ActiveState="active")
    time.sleep(0.5)  # contextd has indexed the unit's EnvironmentFile=
    try:
        yield toold
    finally:
        toold.systemctl("stop", CONFIGURED, check=False)
        toold.run(["rm", "-rf", f"/etc/systemd/system/{CONFIGURED}", "/etc/toolprobe-conf",
                   PROGRAM], check=False)
        toold.systemctl("daemon-reload", check=False)
        toold.systemctl("reset-failed", CONFIGURED, check=False)


def _config_events(instance: Instance) -> int:
    events = call(instance, "ListEvents", interface=CONTEXT, kind="config")["events"]
    return sum(1 for e in events if e.get("path") == ENV)


def _edit(instance: Instance, text: str) -> None:
    """Write the file and wait until contextd has recorded it (and any
    second write of the same edit)."""
    seen = _config_events(instance)
    instance.write(ENV, text)
    wait_until("contextd recorded the edit", lambda: _config_events(instance) > seen, 10)
    time.sleep(0.3)


def test_revert_config_repairs_a_unit_broken_by_an_edited_config(configured: Instance) -> None:
    _edit(configured, "MODE=bad\n")
    configured.systemctl("restart", CONFIGURED, check=False)
    configured.wait_for_unit(CONFIGURED, ActiveState="failed")

    dry = call(configured, "Execute", tool="revert_config",
               parameters={"unit": CONFIGURED, "path": ENV}, dry_run=True)
    assert dry["outcome"] == "not_run"
    assert any("-MODE=bad\n+MODE=good" in step for step in dry["plan"]), dry["plan"]
    assert configured.host_path(ENV).read_text() == "MODE=bad\n", "a dry run wrote"

    result = execute(configured, "revert_config", unit=CONFIGURED, path=ENV)
    assert result["outcome"] == "succeeded", result
    assert (result["previous_active_state"], result["active_state"]) == ("failed", "active")
    assert result["rolled_back"] is False
    assert result["details"]["source"] == "contextd's history"
    assert result["sandbox"] == ["bubblewrap", "landlock", "seccomp"]
    assert configured.host_path(ENV).read_text() == "MODE=good\n"
    assert configured.run(["stat", "-c", "%a %u:%g", ENV]).stdout.split() == ["644", "0:0"]
    assert configured.show(CONFIGURED, "ActiveState")["ActiveState"] == "active"
    record = call(configured, "GetAudit", unit=CONFIGURED, limit=1)["records"][-1]
    assert (record["id"], record["outcome"]) == (result["action_id"], "succeeded")
    assert record["details"]["snapshot_id"] > 0


def test_revert_config_refuses_paths_it_must_not_touch(configured: Instance) -> None:
    configured.run(["ln", "-sf", ENV, "/etc/toolprobe-conf/link.env"])
    for path, why in (("etc/toolprobe-conf/app.env", "absolute"),
                      ("/etc/toolprobe-conf/../passwd", ".."),
                      ("/var/lib/x.env", "/etc"),
                      ("/etc/toolprobe-conf/link.env", "symlink"),
                      ("/etc/toolprobe-conf", "not a regular file"),
                      (ENV, "contextd")):
        error, fields = error_of(configured, "revert_config", unit=CONFIGURED, path=path)
        assert (error, fields["parameter"]) == (f"{NAME}.InvalidArgument", "path"), (path, fields)
        assert why in fields["reason"], (path, fields)
    assert configured.host_path(ENV).read_text() == "MODE=good\n"


def test_a_config_revert_that_makes_things_worse_is_rolled_back(configured: Instance) -> None:
    _edit(configured, "MODE=bad\n")  # version 1: breaks the unit (never applied)
    time.sleep(2.5)  # a separate change, not the same burst of edits
    _edit(configured, "MODE=good\n")  # version 2: fine
    configured.systemctl("restart", CONFIGURED)
    configured.wait_for_unit(CONFIGURED, ActiveState="active")

    result = execute(configured, "revert_config", unit=CONFIGURED, path=ENV)
    assert result["outcome"] == "rolled_back", result
    assert result["rolled_back"] is True
    assert result["details"]["state_after_revert"] == "failed"
    assert result["active_state"] == "active"
    assert configured.host_path(ENV).read_text() == "MODE=good\n"
    assert configured.show(CONFIGURED, "ActiveState")["ActiveState"] == "active"


@pytest.fixture
def oneshot(toold: Instance) -> Iterator[Instance]:
    toold.write(f"/etc/systemd/system/{ONESHOT}",
                "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'exit 7'\n")
    toold.systemctl("daemon-reload")
    try:
        yield toold
    finally:
        toold.run(["rm", "-f", f"/etc/systemd/system/{ONESHOT}"], check=False)
        toold.systemctl("daemon-reload", check=False)
        toold.systemctl("reset-failed", ONESHOT, check=False)


def test_unit_restart_of_a_failed_unit_reports_the_job_result(oneshot: Instance) -> None:
    oneshot.systemctl("start", ONESHOT, check=False)
    oneshot.wait_for_unit(ONESHOT, ActiveState="failed")
    result = execute(oneshot, "unit_restart", unit=ONESHOT)
    assert result["job_result"] == "failed", result
    assert result["active_state"] == "failed"
    assert result["outcome"] == "failed"
    assert result["previous_active_state"] == "failed"
    assert result["details"]["result"] == "exit-code"


def test_unit_restart_brings_a_failed_unit_back(probe: Instance) -> None:
    probe.systemctl("kill", "--signal=KILL", UNIT)
    probe.wait_for_unit(UNIT, ActiveState="failed")
    result = execute(probe, "unit_restart", unit=UNIT)
    assert (result["job_result"], result["active_state"], result["outcome"]) == (
        "done", "active", "succeeded"), result


def test_daemon_reload_reloads(probe: Instance) -> None:
    probe.write(f"/etc/systemd/system/{UNIT}", SERVICE.replace("toold probe", "toold probe v2"))
    assert probe.show(UNIT, "NeedDaemonReload")["NeedDaemonReload"] == "yes"
    result = execute(probe, "daemon_reload")
    assert result["outcome"] == "succeeded", result
    shown = probe.show(UNIT, "NeedDaemonReload", "Description")
    assert shown == {"NeedDaemonReload": "no", "Description": "toold probe v2"}


def test_an_unknown_unit_and_a_denied_unit_are_refused(toold: Instance) -> None:
    assert error_of(toold, "unit_restart", unit="no-such-unit-here.service") == (
        f"{NAME}.UnitNotFound", {"unit": "no-such-unit-here.service"})
    assert error_of(toold, "unit_restart", unit="dbus.service")[0] == f"{NAME}.UnitNotAllowed"
    assert error_of(toold, "unit_restart", unit="toold.service")[0] == f"{NAME}.UnitNotAllowed"


def test_an_unauthorized_uid_is_refused(probe: Instance) -> None:
    started = probe.show(UNIT, "ExecMainStartTimestampMonotonic")
    reply = call_as(probe, NOBODY, NAME, "Execute", tool="unit_restart",
                    parameters={"unit": UNIT})
    assert reply.get("error") == "io.syntrop.Tool1.NotAuthorized", reply
    assert probe.show(UNIT, "ExecMainStartTimestampMonotonic") == started
    record = call(probe, "GetAudit", unit=UNIT, limit=1)["records"][-1]
    assert (record["uid"], record["decision"], record["outcome"]) == (65534, "denied", "not_run")


def test_concurrent_actions_on_one_unit_are_refused_not_queued(toold: Instance) -> None:
    slow = "toolprobe-slow.service"
    toold.write(f"/etc/systemd/system/{slow}",
                "[Service]\nType=exec\nExecStartPre=/bin/sleep 2\nExecStart=/bin/sleep infinity\n")
    toold.systemctl("daemon-reload")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(execute, toold, "unit_restart", unit=slow)
            time.sleep(0.7)
            assert error_of(toold, "unit_restart", unit=slow) == (
                f"{NAME}.UnitBusy", {"unit": slow})
            assert first.result()["outcome"] == "succeeded"
    finally:
        toold.systemctl("stop", slow, check=False)
        toold.run(["rm", "-f", f"/etc/systemd/system/{slow}"], check=False)
        toold.systemctl("daemon-reload", check=False)


def test_clear_cache_empties_only_the_units_cache_directory(toold: Instance) -> None:
    toold.write(f"/etc/systemd/system/{CACHED}",
                "[Service]\nType=exec\nCacheDirectory=syntrop-tool-cache\n"
                "ExecStart=/bin/sleep infinity\n")
    toold.write("/var/lib/syntrop-tool-outside/keep", "keep me\n")
    toold.systemctl("daemon-reload")
    toold.systemctl("start", CACHED)
    try:
        toold.run(["sh", "-c", "cd /var/cache/syntrop-tool-cache && mkdir -p a/b && "
                   "echo x > a/b/f && echo y > g && "
                   "ln -s /var/lib/syntrop-tool-outside/keep link && "
                   "ln -s /var/lib/syntrop-tool-outside linkdir"])
        result = execute(toold, "clear_cache", unit=CACHED)
        assert result["outcome"] == "succeeded", result
        assert result["sandbox"] == ["bubblewrap", "landlock", "seccomp"]
        left = toold.run(["ls", "-A", "/var/cache/syntrop-tool-cache"]).stdout.split()
        assert left == []
        assert toold.host_path("/var/lib/syntrop-tool-outside/keep").read_text() == "keep me\n"
    finally:
        toold.systemctl("stop", CACHED, check=False)
        toold.run(["rm", "-rf", f"/etc/systemd/system/{CACHED}", "/var/lib/syntrop-tool-outside",
                   "/var/cache/syntrop-tool-cache"], check=False)
        toold.systemctl("daemon-reload", check=False)
