"""Kernel message classification on real-format lines."""

import pytest

from syntrop.contextd.kernel import classify


def test_oom_report_names_the_unit() -> None:
    event = classify(
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        "oom_memcg=/system.slice/web.service,task_memcg=/system.slice/web.service,"
        "task=python3,pid=4242,uid=0")
    assert event is not None
    assert (event.action, event.unit, event.pid, event.comm) == ("oom", "web.service", 4242,
                                                                 "python3")


@pytest.mark.parametrize(("message", "action", "pid", "comm"), [
    ("Out of memory: Killed process 1234 (java) total-vm:1000kB, anon-rss:10kB", "oom", 1234,
     "java"),
    ("Memory cgroup out of memory: Killed process 77 (stress) total-vm:5kB", "oom", 77, "stress"),
    ("python3[991]: segfault at 0 ip 00007f00 sp 00007ffd error 4 in libc.so.6[7f00+1000]",
     "segfault", 991, "python3"),
    ("traps: food[12] general protection fault ip:55 sp:7ff error:0 in food[55+1000]",
     "segfault", 12, "food"),
    ("INFO: task jbd2/sda1-8:300 blocked for more than 120 seconds.", "hung_task", 300,
     "jbd2/sda1-8"),
    ("NVRM: Xid (PCI:0000:01:00): 79, pid=555, GPU has fallen off the bus.", "gpu", 555, None),
    ("[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx timeout", "gpu", None, None),
    ("i915 0000:00:02.0: [drm] GPU HANG: ecode 9:1:85dffffb", "gpu", None, None),
    ("blk_update_request: I/O error, dev sda, sector 123 op 0x0:(READ)", "io_error", None, None),
    ("EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory",
     "io_error", None, None),
])
def test_classes(message: str, action: str, pid: int | None, comm: str | None) -> None:
    event = classify(message)
    assert event is not None, message
    assert (event.action, event.pid, event.comm) == (action, pid, comm)
    assert event.summary.startswith("kernel: ") and len(event.summary) <= 200


@pytest.mark.parametrize("message", [
    "", "Linux version 6.1.0", "usb 1-1: new high-speed USB device", "audit: type=1400",
    "EXT4-fs (sda1): mounted filesystem with ordered data mode", "x" * 10000])
def test_ordinary_messages_are_not_events(message: str) -> None:
    assert classify(message) is None


@pytest.mark.parametrize(("message", "severity"), [
    ("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0",
     "uncorrected"),
    ("pcieport 0000:00:1c.0: AER: Multiple Uncorrected (Non-Fatal) error received: "
     "0000:00:1c.0", "uncorrected"),
    ("pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0", "corrected"),
    ("nvidia 0000:01:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
     "type=Transaction Layer, (Requester ID)", "uncorrected"),
    ("pcieport 0000:00:1d.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
     "(Receiver ID)", "corrected"),
])
def test_pcie_errors_keep_the_whole_message(message: str, severity: str) -> None:
    event = classify(message)
    assert event is not None and event.action == "pcie"
    # The PCI addresses stay in the summary: gang triage reads them there.
    assert event.summary == f"kernel: PCIe {severity} error: {message}"
    assert len(event.summary) <= 300
