"""A hypothesis state machine against the real inferenced: clients in their
own cgroups acquire, release and die while emergencies preempt them. After
every step, over the socket and in cgroupfs: per plane active <= total, no
lease lost or duplicated, and the frozen cgroups are exactly those of frozen
leases."""

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import varlink
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from syntrop.system import cgroup
from tests.support import activated, dies_with_us

NAME = "io.syntrop.Inference1"
MOUNT = cgroup.find_mount()

pytestmark = pytest.mark.skipif(
    MOUNT is None or os.geteuid() != 0, reason="needs root and a writable cgroup2 mount"
)


class Client:
    def __init__(self, sandbox: Path, index: int) -> None:
        self.cgroup = sandbox / f"client{index}"
        self.cgroup.mkdir()
        self.process = subprocess.Popen(dies_with_us(["sleep", "600"]))
        (self.cgroup / "cgroup.procs").write_text(str(self.process.pid))

    def kill(self) -> None:
        with contextlib.suppress(cgroup.CgroupError):
            cgroup.set_frozen(self.cgroup, False)
        self.process.kill()
        self.process.wait()
        deadline = time.monotonic() + 5
        while self.cgroup.exists():
            try:
                self.cgroup.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


class InferencedMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert MOUNT is not None
        self.directory = Path(tempfile.mkdtemp(prefix="syntrop-sm-"))
        self.sandbox = MOUNT / f"syntrop-sm-{os.getpid()}-{id(self)}"
        self.sandbox.mkdir()
        self.daemon_context = activated("inferenced", self.directory)
        self.daemon = self.daemon_context.__enter__()
        self.client = varlink.Client(address=self.daemon.address)
        self.iface = self.client.open(NAME)
        self.total = next(p for p in self.iface.GetTopology()["planes"]
                          if p["id"] == "cpu")["total_memory"]
        self.clients: dict[str, Client] = {}  # lease id -> its client process
        self.emergencies: set[str] = set()
        self.counter = 0

    def teardown(self) -> None:
        self.iface.close()
        self.client.cleanup()
        self.daemon_context.__exit__(None, None, None)
        for client in self.clients.values():
            client.kill()
        with contextlib.suppress(OSError):
            self.sandbox.rmdir()
        for path in sorted(self.directory.rglob("*"), reverse=True):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        self.directory.rmdir()

    def leases(self) -> dict[str, Any]:
        return {lease["id"]: lease for lease in self.iface.ListLeases()["leases"]}

    @rule(priority=st.sampled_from(["Batch", "Interactive"]), quarters=st.integers(1, 3))
    def acquire(self, priority: str, quarters: int) -> None:
        self.counter += 1
        client = Client(self.sandbox, self.counter)
        try:
            lease = self.iface.AcquireLease(
                priority=priority, memory_bytes=self.total * quarters // 4, plane="cpu",
                unit=None, pid=client.process.pid,
            )
        except varlink.VarlinkError as error:
            assert error.error() in (f"{NAME}.ResourceExhaustion", f"{NAME}.PressureTooHigh")
            client.kill()
            return
        self.clients[lease["lease_id"]] = client

    @rule(quarters=st.integers(1, 4))
    def emergency(self, quarters: int) -> None:
        leases = self.leases()
        active_emergency = sum(lease["allocated_memory"] for lease in leases.values()
                               if lease["priority"] == "EmergencyTriage")
        try:
            lease = self.iface.AcquireLease(priority="EmergencyTriage",
                                            memory_bytes=self.total * quarters // 4, plane="cpu",
                                            unit=None, pid=os.getpid())
        except varlink.VarlinkError as error:
            assert error.error() == f"{NAME}.ResourceExhaustion"
            # Refused only when even preempting everything below would not do.
            assert self.total * quarters // 4 > self.total - active_emergency
            return
        self.emergencies.add(lease["lease_id"])

    @precondition(lambda self: bool(self.emergencies))
    @rule(data=st.data())
    def end_emergency(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.emergencies)))
        self.iface.ReleaseLease(lease_id=lease_id)
        self.emergencies.discard(lease_id)

    @precondition(lambda self: bool(self.clients))
    @rule(data=st.data(), kill=st.booleans())
    def release_or_kill(self, data: st.DataObject, kill: bool) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.clients)))
        client = self.clients.pop(lease_id)
        if kill:
            client.kill()
            deadline = time.monotonic() + 5
            while lease_id in self.leases():
                assert time.monotonic() < deadline, "lease outlived its client"
                time.sleep(0.02)
        else:
            self.iface.ReleaseLease(lease_id=lease_id)
            client.kill()

    @invariant()
    def consistent(self) -> None:
        leases = self.leases()
        assert set(leases) == set(self.clients) | self.emergencies
        active = sum(lease["allocated_memory"] for lease in leases.values()
                     if lease["state"] == "active")
        assert active <= self.total
        for lease_id, client in self.clients.items():
            assert cgroup.is_frozen(client.cgroup) == (leases[lease_id]["state"] == "frozen")


InferencedMachine.TestCase.settings = settings(
    max_examples=5, stateful_step_count=10, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_inferenced_state_machine = InferencedMachine.TestCase
