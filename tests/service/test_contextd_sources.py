"""contextd's other sources over its real socket: a real journal file,
written by systemd-journal-remote from export-format text and read by
journalctl (--file, and --directory with --follow), and package logs read
incrementally across rotation."""

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.service.contextd_node import (
    call,
    contextd,
    events,
    journal_remote,
    kernel,
    on,
    wait_event,
    write_journal,
)

S = 1_000_000
INVOCATION = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
FAILURE_ID = "d9b373ed55a64feb8242e02dbe79a49c"


needs_journal = pytest.mark.skipif(
    journal_remote() is None or shutil.which("journalctl") is None,
    reason="systemd-journal-remote or journalctl missing (Debian: systemd-journal-remote)")


def web(ts: int, message: str, priority: int = 6, **fields: Any) -> dict[str, Any]:
    return {"ts": ts, "MESSAGE": message, "PRIORITY": priority, "_SYSTEMD_UNIT": "web.service",
            "_PID": 4242, "SYSLOG_IDENTIFIER": "web", "_SYSTEMD_INVOCATION_ID": INVOCATION,
            **fields}


def systemd(ts: int, message: str, priority: int = 6, **fields: Any) -> dict[str, Any]:
    return {"ts": ts, "MESSAGE": message, "PRIORITY": priority, "_PID": 1, "UNIT": "web.service",
            "_SYSTEMD_UNIT": "init.scope", "SYSLOG_IDENTIFIER": "systemd",
            "INVOCATION_ID": INVOCATION, **fields}


def other(ts: int, message: str) -> dict[str, Any]:
    return {"ts": ts, "MESSAGE": message, "PRIORITY": 3, "_SYSTEMD_UNIT": "other.service",
            "_PID": 777, "SYSLOG_IDENTIFIER": "other"}


def failure_journal(start: int) -> tuple[list[dict[str, Any]], int]:
    """A web.service start that fails among an unrelated unit's errors, and
    the kernel's view; the failure's time."""
    entries: list[dict[str, Any]] = []
    for i in range(200):
        entries.append(other(start + i * 10_000, f"other noise {i}"))
    t = start + 3 * S
    entries.append(systemd(t, "Starting web.service - Web server..."))
    for i in range(10):
        entries.append(web(t + (i + 1) * 1000, f"web: loading module {i}"))
    entries.append(web(t + 20_000, "web: cannot bind 0.0.0.0:80: Address already in use", 3))
    entries.append(kernel(t + 25_000, "web[4242]: segfault at 0 ip 00007f00 sp 00007ffd "
                                      "error 4 in libc.so.6[7f00+1000]"))
    entries.append(systemd(t + 30_000, "web.service: Main process exited, code=exited, "
                                       "status=1/FAILURE", 5))
    failure = t + 31_000
    entries.append(systemd(failure, "web.service: Failed with result 'exit-code'.", 4,
                           MESSAGE_ID=FAILURE_ID, UNIT_RESULT="exit-code"))
    entries.append(systemd(failure + 1000, "Failed to start web.service - Web server.", 3,
                           JOB_RESULT="failed"))
    entries.append(kernel(failure + 2000, "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
                          "cpuset=/,mems_allowed=0,oom_memcg=/system.slice/db.service,"
                          "task_memcg=/system.slice/db.service,task=db,pid=999,uid=0"))
    entries.append(kernel(failure + 3000, "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx "
                                          "timeout"))
    entries.append(kernel(failure + 4000, "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) "
                                          "error received: 0000:01:00.0"))
    for i in range(50):
        entries.append(other(failure + 5000 + i * 1000, f"other after {i}"))
    entries.append(web(failure + 100 * S, "web: much later, another run"))
    return entries, failure


@needs_journal
def test_failure_context_from_a_real_journal_file(tmp_path: Path) -> None:
    system = tmp_path / "system"
    (system / "web.service.d").mkdir(parents=True)
    (system / "web.service").write_text("[Service]\nExecStart=/usr/sbin/web\n")
    (system / "other.service").write_text("[Service]\nExecStart=/usr/sbin/other\n")
    # The failure is a few seconds ahead, so the edits below come before it,
    # as they would on a host.
    start = time.time_ns() // 1000 + 2 * S
    entries, failure = failure_journal(start)
    journal = tmp_path / "journal" / "remote.journal"
    journal.parent.mkdir()
    write_journal(journal, entries)
    with contextd(tmp_path, [system], journal={
            "journalctl": "journalctl", "files": [str(journal)], "lines_before": 5,
            "lines_after": 3, "after_seconds": 10}) as daemon:
        override = system / "web.service.d" / "override.conf"
        override.write_text("[Service]\nExecStart=\nExecStart=/usr/sbin/web --port 80\n")
        wait_event(daemon, on(override, "created"))
        (system / "other.service").write_text("[Service]\nExecStart=/usr/sbin/other -v\n")
        wait_event(daemon, on(system / "other.service", "modified"))

        context = call(daemon, "GetUnitContext", unit="web.service", include_diffs=True)
        assert context["failure_usec"] == failure
        assert context["invocation_id"] == INVOCATION
        assert context.get("journal_error") is None
        messages = [line["message"] for line in context["journal"]]
        # Five lines up to the failure, then those after it within 10 s (the
        # job's failure; not the run 100 s later); no other unit's lines.
        assert messages == [
            "web: loading module 8",
            "web: loading module 9",
            "web: cannot bind 0.0.0.0:80: Address already in use",
            "web.service: Main process exited, code=exited, status=1/FAILURE",
            "web.service: Failed with result 'exit-code'.",
            "Failed to start web.service - Web server.",
        ]
        assert all(line.get("unit") == "web.service" for line in context["journal"])
        assert context["journal"][1]["pid"] == 4242

        ranked = context["events"]
        assert ranked[0].get("path") == str(override), [e["summary"] for e in ranked]
        assert ranked[0]["diff"].endswith("+ExecStart=/usr/sbin/web --port 80\n")
        summaries = [e["summary"] for e in ranked]
        assert not any("other.service" in s for s in summaries), summaries
        # The segfault is the unit's own process (its pid is in the slice);
        # the OOM kill and the GPU error are the host's, ranked low.
        kinds = [(e["kind"], e["action"]) for e in ranked]
        assert kinds.index(("kernel", "segfault")) < kinds.index(("kernel", "oom"))
        assert all(e["relevance"] < ranked[0]["relevance"] for e in ranked[1:])
        assert max(e["relevance"] for e in ranked
                   if e["action"] in ("oom", "gpu", "pcie")) < 0.2

        # The same failure asked for exactly: by invocation, by time.
        by_invocation = call(daemon, "GetUnitContext", unit="web.service",
                             invocation_id=INVOCATION)
        assert by_invocation["journal"][-1]["message"] != "web: much later, another run"
        by_time = call(daemon, "GetUnitContext", unit="web.service", failure_usec=failure)
        assert [line["message"] for line in by_time["journal"]] == messages

        # Another unit's slice holds its own lines only.
        lines = call(daemon, "GetUnitContext", unit="other.service")["journal"]
        assert lines and all(line.get("unit") == "other.service" for line in lines)
        # A unit with no file, known from the kernel's OOM report.
        db = call(daemon, "GetUnitContext", unit="db.service")["events"]
        assert db[0]["action"] == "oom" and db[0]["unit"] == "db.service"
        assert all(e["relevance"] < db[0]["relevance"] for e in db[1:])
        kernel_events = events(daemon, kind="kernel")
        assert {e["action"] for e in kernel_events} == {"segfault", "oom", "gpu", "pcie"}
        pcie = next(e for e in kernel_events if e["action"] == "pcie")
        assert "0000:01:00.0" in pcie["summary"]
        oom = next(e for e in kernel_events if e["action"] == "oom")
        assert oom["unit"] == "db.service" and oom["pid"] == 999


@needs_journal
def test_kernel_events_are_followed_in_a_journal_directory(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    directory = tmp_path / "journal"
    directory.mkdir()
    now = time.time_ns() // 1000
    write_journal(directory / "remote.journal", [
        kernel(now - 10 * S, "Out of memory: Killed process 31 (hog) total-vm:1kB"),
        kernel(now - 9 * S, "usb 1-1: new high-speed USB device number 2"),
    ])
    with contextd(tmp_path, [system], journal={"journalctl": "journalctl",
                                               "directory": str(directory)}) as daemon:
        wait_event(daemon, lambda e: e["action"] == "oom" and e.get("pid") == 31)
        write_journal(directory / "remote.journal", [
            kernel(now, "INFO: task kworker/0:1:17 blocked for more than 120 seconds."),
        ])
        hung = wait_event(daemon, lambda e: e["action"] == "hung_task")
        assert hung["pid"] == 17 and hung["kind"] == "kernel"
        assert len(events(daemon, kind="kernel")) == 2  # the USB line is not an event
    # Restarted, it goes on from its cursor: nothing twice.
    write_journal(directory / "remote.journal", [
        kernel(now + S, "python3[55]: segfault at 8 ip 1 sp 2 error 4 in x.so[1+2]")])
    with contextd(tmp_path, [system], journal={"journalctl": "journalctl",
                                               "directory": str(directory)}) as daemon:
        wait_event(daemon, lambda e: e["action"] == "segfault")
        assert sorted(e["action"] for e in events(daemon, kind="kernel")) == [
            "hung_task", "oom", "segfault"]


DPKG_START = "2024-01-15 10:00:00 install base:amd64 <none> 1.0\n"


def dpkg_line(minute: int, verb: str, package: str, old: str, new: str) -> str:
    return f"2024-01-15 10:{minute:02d}:00 {verb} {package}:amd64 {old} {new}\n"


def test_package_logs_incremental_with_rotation(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    (system / "web.service").write_text("[Service]\nExecStart=/usr/sbin/web\n")
    info = tmp_path / "info"
    info.mkdir()
    (info / "web:amd64.list").write_text("/.\n/lib/systemd/system/web.service\n/usr/sbin/web\n")
    (info / "libweb:amd64.list").write_text("/usr/lib/x86_64-linux-gnu/libweb.so.1\n")
    logs = tmp_path / "log"
    (logs / "apt").mkdir(parents=True)
    dpkg, apt = logs / "dpkg.log", logs / "apt" / "history.log"
    dpkg.write_text(DPKG_START)
    apt.write_text("")
    packages = {"dpkg_log": str(dpkg), "apt_history": str(apt), "dpkg_info": str(info)}
    timeline = {"retention_days": 36500, "default_window_hours": 24 * 36500}

    def package_events(daemon: Any) -> list[dict[str, Any]]:
        return events(daemon, kind="package")

    with contextd(tmp_path, [system], packages=packages, timeline=timeline) as daemon:
        assert [e.get("package") for e in package_events(daemon)] == ["base"]
        with dpkg.open("a") as log:
            log.write(dpkg_line(1, "upgrade", "web", "1.0", "1.1"))
            log.write("2024-01-15 10:01:00 status installed web:amd64 1.1\n")
            log.write("this line is not dpkg's\n")
            log.write(dpkg_line(2, "install", "libweb", "<none>", "2"))
            log.flush()
            log.write("2024-01-15 10:03:00 remove ol")  # half a line, still being written
        wait_event(daemon, lambda e: e.get("package") == "libweb")
        assert [e.get("package") for e in package_events(daemon)] == ["base", "web", "libweb"]
        assert call(daemon, "GetStatus")["skipped_lines"] == 1

        with dpkg.open("a") as log:
            log.write("d:amd64 3 <none>\n")  # the half line completed, then rotation:
        os.rename(dpkg, logs / "dpkg.log.1")
        dpkg.write_text(dpkg_line(4, "purge", "gone", "1", "<none>"))
        wait_event(daemon, lambda e: e.get("package") == "gone")
        assert [e.get("package") for e in package_events(daemon)] == [
            "base", "web", "libweb", "old", "gone"]

        with apt.open("a") as log:
            log.write("\nStart-Date: 2024-01-15  10:05:00\nCommandline: apt-get install web\n"
                      "Upgrade: web:amd64 (1.1, 1.2)\n")
            log.flush()
            time.sleep(0.3)  # the stanza is not complete yet: nothing recorded
            assert not [e for e in package_events(daemon) if e["action"] == "transaction"]
            log.write("End-Date: 2024-01-15  10:05:09\n")
        transaction = wait_event(daemon, lambda e: e["action"] == "transaction")
        assert "apt-get install web" in transaction["summary"]
        # Logged in 2024, recorded now: a follower by id sees it, one by time
        # would not.
        assert events(daemon, after_id=transaction["id"] - 1) == [transaction]
        assert events(daemon, since_usec=time.time_ns() // 1000 - 60 * S) == []

        # The package that ships the unit's file ranks among its context.
        failure = int(time.mktime(time.strptime("2024-01-15 10:10:00", "%Y-%m-%d %H:%M:%S")))
        context = call(daemon, "GetUnitContext", unit="web.service", failure_usec=failure * S,
                       window_usec=3600 * S)
        related = [e.get("package") or e["summary"] for e in context["events"]]
        assert related == [transaction["summary"], "web"], related

    # Restart: positions were kept, nothing is read twice.
    with contextd(tmp_path, [system], packages=packages, timeline=timeline) as daemon:
        assert len(package_events(daemon)) == 6
        with dpkg.open("a") as log:
            log.write(dpkg_line(6, "install", "new", "<none>", "1"))
        wait_event(daemon, lambda e: e.get("package") == "new")
        assert len(package_events(daemon)) == 7
