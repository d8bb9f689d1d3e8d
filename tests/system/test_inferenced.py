"""inferenced under a real systemd: GetTopology through varlinkctl, and an
EmergencyTriage lease freezing the cgroup of a transient unit that holds a
Batch lease, then thawing it on release."""

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.system.instance import Instance, wait_until

NAME = "io.syntrop.Inference1"
HOLDER = "leaseholder.service"


def address(instance: Instance) -> str:
    return f"unix:{instance.host_path(f'/run/syntrop/{NAME}')}"


def call(instance: Instance, method: str, **params: Any) -> Any:
    return instance.call(NAME, method, **params)


def test_get_topology_through_varlinkctl_has_the_seed_shape(
    instance: Instance, varlinkctl_bin: str
) -> None:
    result = subprocess.run(
        [varlinkctl_bin, "call", address(instance), f"{NAME}.GetTopology", "{}"],
        capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert set(reply) == {"planes", "total_ram", "available_ram", "cpu_cores"}
    (cpu,) = [plane for plane in reply["planes"] if plane["kind"] == "cpu"]
    assert {"id", "name", "kind", "total_memory", "available_memory",
            "is_triage_reserved"} <= set(cpu)
    assert cpu["total_memory"] == reply["total_ram"] > 0


def frozen(instance: Instance, unit: str) -> bool:
    events = instance.run(["cat", f"/sys/fs/cgroup/system.slice/{unit}/cgroup.events"]).stdout
    return "frozen 1" in events.splitlines()


@pytest.fixture
def holder(instance: Instance) -> Iterator[int]:
    instance.run(["systemd-run", f"--unit={HOLDER}", "--property=Type=exec",
                  "/bin/sleep", "infinity"])
    shown = instance.wait_for_unit(HOLDER, ActiveState="active")
    pid = int(instance.show(HOLDER, "MainPID")["MainPID"])
    yield pid
    instance.systemctl("stop", HOLDER, check=False)
    instance.systemctl("reset-failed", HOLDER, check=False)
    assert shown


def test_emergency_lease_freezes_a_transient_units_cgroup_and_thaws_it(
    instance: Instance, holder: int
) -> None:
    total = call(instance, "GetTopology")["total_ram"]
    batch = call(instance, "AcquireLease", priority="Batch", memory_bytes=total * 3 // 4,
                 plane="cpu", unit=HOLDER, pid=holder)
    assert not frozen(instance, HOLDER)
    emergency = call(instance, "AcquireLease", priority="EmergencyTriage",
                     memory_bytes=total // 2, plane="cpu", unit=None, pid=None)
    # Frozen before the reply came back.
    assert frozen(instance, HOLDER)
    leases = {lease["id"]: lease for lease in call(instance, "ListLeases")["leases"]}
    assert leases[batch["lease_id"]]["state"] == "frozen"
    assert leases[batch["lease_id"]]["client_unit"] == HOLDER
    call(instance, "ReleaseLease", lease_id=emergency["lease_id"])
    assert not frozen(instance, HOLDER)
    assert instance.show(HOLDER, "ActiveState")["ActiveState"] == "active"
    # The lease dies with the unit's process.
    instance.systemctl("stop", HOLDER)
    wait_until("the batch lease to go with its process",
               lambda: not call(instance, "ListLeases")["leases"] or None, 10)
