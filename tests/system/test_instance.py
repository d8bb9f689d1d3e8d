"""The instance itself keeps its promises: a real systemd as PID 1 that came
up clean, and cannot reach the host's kernel knobs, clock, modules or /tmp."""

import os
from pathlib import Path

from tests.system.instance import DROPPED_CAPS, Instance

CAP_BITS = {"sys_module": 16, "sys_rawio": 17, "sys_time": 25, "wake_alarm": 35}


def test_systemd_is_pid_1_and_nothing_failed(instance: Instance) -> None:
    assert instance.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
    assert instance.systemctl("is-system-running").strip() == "running"
    assert instance.systemctl("list-units", "--failed", "--no-legend").strip() == ""


def test_pid_1_lacks_the_dangerous_capabilities(instance: Instance) -> None:
    status = Path(f"/proc/{instance.pid}/status").read_text()
    bounding = int(next(line for line in status.splitlines() if line.startswith("CapBnd:"))[7:], 16)
    for cap in DROPPED_CAPS:
        assert not bounding & (1 << CAP_BITS[cap]), f"PID 1 still has CAP_{cap.upper()}"


def test_kernel_knobs_are_read_only_inside(instance: Instance) -> None:
    for knob in ("/proc/sys/kernel/core_pattern", "/sys/kernel/mm/transparent_hugepage/enabled"):
        result = instance.run(["sh", "-c", f"echo x > {knob}"], check=False)
        assert result.returncode != 0
        assert "Read-only file system" in result.stderr, result.stderr


def test_tmp_and_run_are_private(instance: Instance) -> None:
    name = f"syntrop-system-private-{os.getpid()}"
    instance.run(["touch", f"/tmp/{name}", f"/run/{name}"])
    assert not os.path.exists(f"/tmp/{name}")
    assert not os.path.exists(f"/run/{name}")
    instance.run(["rm", f"/tmp/{name}", f"/run/{name}"])
