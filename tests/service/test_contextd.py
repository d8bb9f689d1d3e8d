"""contextd over its real activated socket, watching temporary unit
directories with real inotify (and fanotify where root): writes, editors'
rename-replace, deletes, creates, mode changes, a drop-in directory that
appears later, enablement links, binary, huge and special files, changes
made while it was not running, a flood of 10,000 changes, bad parameters.

The journal and package sources are in test_contextd_sources.py."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.service.contextd_node import (
    NAME,
    call,
    configure,
    contextd,
    diff_of,
    error_of,
    events,
    on,
    wait_event,
)
from tests.service.wire import (
    assert_no_traceback,
    daemon_env,
    daemon_named,
    running,
    wait_for,
)
from tests.support import require_nobody_can_run_us


def test_file_changes_are_recorded_with_diffs(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    with contextd(tmp_path, [system], files={"max_file_bytes": 4096}) as daemon:
        fanotify = call(daemon, "GetStatus")["fanotify"]
        unit = system / "web.service"
        unit.write_text("[Service]\nExecStart=/usr/bin/web\n")
        created = wait_event(daemon, on(unit, "created"))
        assert created["kind"] == "unit_file" and created["unit"] == "web.service"
        assert "+ExecStart=/usr/bin/web" in diff_of(daemon, created)
        if fanotify:  # root: the writer is named
            assert created["pid"] == os.getpid(), created

        # An editor's save: a temporary file renamed over the unit.
        temporary = system / ".web.service.swp"
        temporary.write_text("[Service]\nExecStart=/usr/bin/web --fast\n")
        os.replace(temporary, unit)
        modified = wait_event(daemon, on(unit, "modified"))
        assert "-ExecStart=/usr/bin/web\n+ExecStart=/usr/bin/web --fast\n" in \
            diff_of(daemon, modified)
        if fanotify:
            assert modified["pid"] == os.getpid()

        unit.chmod(0o600)
        mode = wait_event(daemon, on(unit, "mode"))
        assert mode["mode"] == 0o600 and not mode["has_diff"]

        # A drop-in directory that appears later, its file written at once.
        dropins = system / "web.service.d"
        dropins.mkdir()
        (dropins / "override.conf").write_text("[Service]\nEnvironment=DEBUG=1\n")
        dropin = wait_event(daemon, on(dropins / "override.conf", "created"))
        assert dropin["kind"] == "dropin" and dropin["unit"] == "web.service"
        assert "+Environment=DEBUG=1" in dropin["summary"]

        # Enabling: a link in a .wants directory.
        wants = system / "multi-user.target.wants"
        wants.mkdir()
        (wants / "web.service").symlink_to(unit)
        link = wait_event(daemon, on(wants / "web.service", "created"))
        assert f"+-> {unit}" in diff_of(daemon, link)

        # Binary, too large, a FIFO: recorded, no diff body, nothing blocks.
        (system / "blob.service").write_bytes(b"\x7fELF\x00" * 10)
        blob = wait_event(daemon, on(system / "blob.service", "created"))
        assert not blob["has_diff"] and "binary, 50 bytes" in blob["summary"]
        (system / "huge.service").write_text("x\n" * 10_000)
        huge = wait_event(daemon, on(system / "huge.service", "created"))
        assert not huge["has_diff"] and "too large to diff" in huge["summary"]
        os.mkfifo(system / "trap.service")
        wait_event(daemon, on(system / "trap.service", "created"))

        unit.unlink()
        deleted = wait_event(daemon, on(unit, "deleted"))
        assert "-ExecStart=/usr/bin/web --fast" in diff_of(daemon, deleted)

        # What systemd ignores is not recorded.
        (system / "web.service~").write_text("backup")
        (dropins / "notes.txt").write_text("x")
        (system / "zz.service").write_text("[Unit]\n")  # a marker written last
        wait_event(daemon, on(system / "zz.service", "created"))
        paths = {e.get("path") for e in events(daemon)}
        assert str(system / "web.service~") not in paths
        assert str(dropins / "notes.txt") not in paths
        assert str(temporary) not in paths

        status = call(daemon, "GetStatus")
        assert str(system) in status["watched_paths"] and str(dropins) in status["watched_paths"]
        assert status["dropped_events"] == 0


def test_references_are_watched_and_ranked(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    env = tmp_path / "default" / "web"
    env.parent.mkdir()
    env.write_text("PORT=80\n")
    other = system / "other.service"
    other.write_text("[Service]\nExecStart=/bin/true\n")
    with contextd(tmp_path, [system]) as daemon:
        (system / "web.service").write_text(
            f"[Service]\nEnvironmentFile=-{env}\nExecStart=/usr/bin/web\n")
        wait_event(daemon, on(system / "web.service", "created"))
        # The reference is watched once the unit is read.
        wait_for(lambda: str(env.parent) in call(daemon, "GetStatus")["watched_paths"], 10,
                 "the EnvironmentFile's directory is not watched")
        env.write_text("PORT=8080\n")
        config = wait_event(daemon, on(env, "modified"))
        assert config["kind"] == "config" and "-PORT=80\n+PORT=8080" in diff_of(daemon, config)
        other.write_text("[Service]\nExecStart=/bin/false\n")
        wait_event(daemon, on(other, "modified"))

        context = call(daemon, "GetUnitContext", unit="web.service", include_diffs=True)
        paths = [e.get("path") for e in context["events"]]
        assert paths[:2] == [str(system / "web.service"), str(env)]
        assert str(other) not in paths, "an unrelated unit's change was included"
        assert context["events"][1]["diff"].endswith("+PORT=8080\n")
        assert context["journal"] == [] and "turned off" in context.get("journal_error", "")


def test_changes_while_down_are_found_at_start(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    (system / "kept.service").write_text("[Service]\nExecStart=/bin/a\n")
    (system / "gone.service").write_text("[Unit]\n")
    env = tmp_path / "ref.env"
    env.write_text("A=1\n")
    (system / "ref.service").write_text(f"[Service]\nEnvironmentFile={env}\n")
    with contextd(tmp_path, [system]) as daemon:
        assert events(daemon) == [], "the first start is a baseline, not a list of creations"
        (system / "live.service").write_text("[Unit]\n")
        first = wait_event(daemon, on(system / "live.service", "created"))
    (system / "kept.service").write_text("[Service]\nExecStart=/bin/b\n")
    (system / "gone.service").unlink()
    (system / "new.service").write_text("[Unit]\n")
    written = os.stat(system / "kept.service").st_mtime_ns // 1000
    with contextd(tmp_path, [system]) as daemon:
        kept = wait_event(daemon, on(system / "kept.service", "modified"))
        assert "found at start-up" in kept["summary"]
        assert kept["timestamp_usec"] == written
        assert "-ExecStart=/bin/a\n+ExecStart=/bin/b\n" in diff_of(daemon, kept)
        wait_event(daemon, on(system / "gone.service", "deleted"))
        wait_event(daemon, on(system / "new.service", "created"))
        # The timeline survived the restart, ids keep growing.
        assert first["id"] in [e["id"] for e in events(daemon)]
        assert kept["id"] > first["id"]
        # An unchanged unit is still known, and what it references watched.
        env.write_text("A=2\n")
        wait_event(daemon, on(env, "modified"))
        context = call(daemon, "GetUnitContext", unit="ref.service")
        assert [e.get("path") for e in context["events"]] == [str(env)]


def test_a_flood_is_bounded_and_drops_are_counted(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    watched = system / "important.service"
    watched.write_text("[Unit]\n")
    ring, shadow = 3000, 256 * 1024
    with contextd(tmp_path, [system], timeline={"ring_size": ring, "flood_rate": 500,
                                                "flood_burst": 1000},
                  files={"max_shadow_bytes": shadow}) as daemon:
        rss_before = _rss(daemon.pid)
        # As fast as this process can (the rate is the machine's; bench/
        # measures it): 10,000 files created and closed.
        for i in range(10_000):
            fd = os.open(system / f"flood{i}.service", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            os.write(fd, f"[Unit]\nDescription={i}\n{'#' * 64}\n".encode())
            os.close(fd)

        # Wait until it has caught up: the counts stop moving.
        deadline = time.monotonic() + 90  # generous: the machine may be busy
        previous: dict[str, Any] = {}
        while True:
            status = call(daemon, "GetStatus")
            if status == previous and status["events"] + status["dropped_events"] >= 2000:
                break
            assert time.monotonic() < deadline, status
            previous = status
            time.sleep(0.5)
        assert status["dropped_events"] > 0, status
        assert status["events"] <= ring
        assert status["shadow_bytes"] <= shadow
        growth = _rss(daemon.pid) - rss_before
        assert growth < 80 * 1024 * 1024, f"RSS grew by {growth >> 20} MiB"
        # Once the flood is over, a change is recorded again.
        time.sleep(1.0)
        watched.write_text("[Unit]\nDescription=after the flood\n")
        wait_event(daemon, on(watched, "modified"), timeout=15)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_bad_parameters_get_declared_errors(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    (system / "web.service").write_text("[Unit]\n")
    invalid = "org.varlink.service.InvalidParameter"
    with contextd(tmp_path, [system]) as daemon:
        assert error_of(daemon, "GetUnitContext", unit="nothing.service") == (
            f"{NAME}.UnitNotFound", {"unit": "nothing.service"})
        for name in ("", "web", "../web.service", "a b.service", "x" * 300 + ".service",
                     "web@.service", "web.service\0"):
            assert error_of(daemon, "GetUnitContext", unit=name)[0] == f"{NAME}.InvalidUnitName"
        error, parameters = error_of(daemon, "GetUnitContext", unit="web.service",
                                     window_usec=-1)
        assert error == f"{NAME}.InvalidWindow" and parameters["window_usec"] == -1
        error, parameters = error_of(daemon, "GetUnitContext", unit="web.service",
                                     window_usec=2**62)
        assert error == f"{NAME}.InvalidWindow" and parameters["max_usec"] == 30 * 86400 * 10**6
        for key, value in (("failure_usec", -5), ("failure_usec", 2**62),
                           ("invocation_id", "not-an-id"), ("limit", 0), ("limit", 10**6)):
            assert error_of(daemon, "GetUnitContext", unit="web.service", **{key: value}) == (
                invalid, {"parameter": key})
        assert error_of(daemon, "ListEvents", kind="bogus") == (invalid, {"parameter": "kind"})
        assert error_of(daemon, "ListEvents", limit=-1) == (invalid, {"parameter": "limit"})
        assert error_of(daemon, "ListEvents", since_usec=-1)[0] == invalid
        assert error_of(daemon, "ListEvents", after_id=-1) == (invalid, {"parameter": "after_id"})
        for event_id in (0, -1, 10**12):
            assert error_of(daemon, "GetEvent", id=event_id) == (
                f"{NAME}.EventNotFound", {"id": event_id})
        # A known unit with nothing recorded: an empty answer, not an error.
        context = call(daemon, "GetUnitContext", unit="web.service", window_usec=0)
        assert context["events"] == [] and context["unit"] == "web.service"


def test_it_stays_up_while_watching_unless_told_otherwise(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    with contextd(tmp_path / "a", [system], idle_timeout=0.3) as daemon:
        time.sleep(1.2)
        assert daemon.process.poll() is None, "exited on idle while watching"
    configure(tmp_path / "b", [system], top="exit_on_idle = true")
    with running("contextd", tmp_path / "b", idle_timeout=0.3) as daemon:
        assert daemon.process.wait(5) == 0
        assert_no_traceback(daemon.log_text())


def test_a_bad_configuration_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "contextd.toml").write_text("[timeline]\nring_size = -3\n")
    result = subprocess.run(
        [sys.executable, "-m", "syntrop.contextd"], capture_output=True, text=True, timeout=30,
        env=daemon_env(tmp_path, daemon_named("contextd")), check=False)
    assert result.returncode == 1
    assert "contextd.toml: ring_size must be an integer >= 1" in result.stderr
    assert "Traceback" not in result.stderr


#: A journalctl that answers --unit=U with the entries of U below (as JSON
#: lines, newest first) and anything else with nothing.
FAKE_JOURNALCTL = """
import json, sys
entries = {
    "sshd.service": [{"_UID": "0", "MESSAGE": "Accepted password for root"}],
    "mine.service": [{"_UID": "65534", "MESSAGE": "nobody's own line"},
                     {"_UID": "0", "_PID": "1", "UNIT": "mine.service",
                      "MESSAGE": "mine.service: Failed with result 'exit-code'."}],
}
units = [a.removeprefix("--unit=") for a in sys.argv[1:] if a.startswith("--unit=")]
for n, fields in enumerate(entries.get(units[0], []) if units else []):
    fields = {"__REALTIME_TIMESTAMP": str(1_700_000_000_000_000 - n), "__CURSOR": f"c{n}",
              "PRIORITY": "6", "_PID": "42", "_SYSTEMD_UNIT": units[0], **fields}
    print(json.dumps(fields))
"""

#: GetUnitContext of each unit named, as nobody calls it: lines and error.
CONTEXT_AS_NOBODY = """
import json, os, sys, varlink
os.setgroups([]); os.setgid(65534); os.setuid(65534)
answers = {}
for unit in sys.argv[2:]:
    with varlink.Client(address=sys.argv[1]) as client, \\
            client.open("io.syntrop.Context1") as context:
        reply = context.GetUnitContext(unit=unit)
        answers[unit] = [[e["message"] for e in reply["journal"]], reply.get("journal_error")]
print(json.dumps(answers))
"""


def test_journal_lines_only_to_those_who_may_read_them() -> None:
    """A stranger gets no lines of another uid's unit, and why; the unit's
    own uid gets its lines; root gets every unit's."""
    require_nobody_can_run_us()
    root = Path(tempfile.mkdtemp(prefix="syntrop-contextd-"))  # nobody must reach the socket
    try:
        root.chmod(0o755)
        system = root / "system"
        system.mkdir()
        journalctl = root / "journalctl"
        journalctl.write_text(f"#!{sys.executable}\n{FAKE_JOURNALCTL}")
        journalctl.chmod(0o755)
        with contextd(root, [system], journal={"journalctl": str(journalctl),
                                               "kernel": False}) as daemon:
            socket = Path(daemon.address.removeprefix("unix:"))
            for directory in (root / "run", socket.parent):
                directory.chmod(0o755)
            socket.chmod(0o666)
            as_root = call(daemon, "GetUnitContext", unit="sshd.service")
            assert [e["message"] for e in as_root["journal"]] == ["Accepted password for root"]
            assert as_root.get("journal_error") is None

            out = subprocess.run([sys.executable, "-c", CONTEXT_AS_NOBODY, daemon.address,
                                  "sshd.service", "mine.service"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            answers = json.loads(out.stdout)
            lines, error = answers["sshd.service"]
            assert lines == [] and error is not None and "systemd-journal" in error, answers
            lines, error = answers["mine.service"]
            assert "nobody's own line" in lines and error is None, answers
    finally:
        shutil.rmtree(root, ignore_errors=True)
