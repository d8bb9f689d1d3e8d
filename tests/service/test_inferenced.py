"""inferenced over its real activated socket: topology, leases, preemption
through the real cgroup v2 freezer, pressure, gangs, sealed memfds, models,
quarantine, restart."""

import asyncio
import contextlib
import fcntl
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import varlink

from syntrop.interfaces.inference import Inference1
from syntrop.system import cgroup
from syntrop.varlink.client import connect
from tests import fakesysfs
from tests.fakesysfs import GiB
from tests.support import (
    Activated,
    activated,
    declared_error,
    require_nobody_can_run_us,
    varlink_call,
)

NAME = "io.syntrop.Inference1"


@contextlib.contextmanager
def inferenced(tmp_path: Path, config: str = "") -> Iterator[Activated]:
    (tmp_path / "config").mkdir(parents=True, exist_ok=True)
    (tmp_path / "config" / "inferenced.toml").write_text(config)
    with activated("inferenced", tmp_path) as daemon:
        yield daemon


def call(daemon: Activated, method: str, **params: Any) -> Any:
    return varlink_call(daemon.address, NAME, method, **params)


def error_of(daemon: Activated, method: str, **params: Any) -> tuple[str, dict[str, Any]]:
    return declared_error(call, daemon, method, **params)


def acquire(daemon: Activated, priority: str, memory: int, *, plane: str | None = None,
            pid: int | None = None, unit: str | None = None) -> Any:
    return call(daemon, "AcquireLease", priority=priority, memory_bytes=memory, plane=plane,
                unit=unit, pid=pid)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_topology_has_the_seed_reply_shape(tmp_path: Path) -> None:
    with inferenced(tmp_path) as daemon:
        reply = call(daemon, "GetTopology")
    assert set(reply) == {"planes", "total_ram", "available_ram", "cpu_cores"}
    cpu = next(p for p in reply["planes"] if p["id"] == "cpu")
    assert {"id", "name", "kind", "total_memory", "available_memory",
            "is_triage_reserved"} <= set(cpu)
    assert cpu["kind"] == "cpu" and cpu["total_memory"] == reply["total_ram"] > 0
    assert reply["cpu_cores"] == os.cpu_count()


def test_fake_amd_box_and_pressure_levels(tmp_path: Path) -> None:
    tree = fakesysfs.amd_box(tmp_path / "tree")
    with inferenced(tmp_path, f'root = "{tree}"\n') as daemon:
        planes = {p["id"]: p for p in call(daemon, "GetTopology")["planes"]}
        assert planes["drm-renderD128"]["total_memory"] == 24 * GiB
        assert planes["drm-renderD128"]["available_memory"] == 22 * GiB
        lease = acquire(daemon, "Batch", 4 * GiB, pid=os.getpid())
        assert lease["plane_id"] == "drm-renderD128"  # accelerators before the CPU
        planes = {p["id"]: p for p in call(daemon, "GetTopology")["planes"]}
        assert planes["drm-renderD128"]["available_memory"] == 18 * GiB
        assert call(daemon, "GetPressure")["level"] == "normal"

        fakesysfs.write(tree / "proc" / "pressure" / "memory",
                        "some avg10=12.50 avg60=0 avg300=0 total=1\n")
        time.sleep(0.6)  # inferenced reuses a PSI reading for 0.5 s
        pressure = call(daemon, "GetPressure")
        assert (pressure["level"], pressure["memory_some"]) == ("elevated", 12.5)
        assert error_of(daemon, "AcquireLease", priority="Batch", memory_bytes=1, plane=None,
                        unit=None, pid=os.getpid()) == (
            f"{NAME}.PressureTooHigh",
            {"resource": "memory", "level": "elevated", "priority": "Batch"},
        )
        acquire(daemon, "Interactive", 1, pid=os.getpid())
        fakesysfs.write(tree / "proc" / "pressure" / "memory",
                        "some avg10=40.00 avg60=0 avg300=0 total=1\n")
        time.sleep(0.6)
        name, _ = error_of(daemon, "AcquireLease", priority="Interactive", memory_bytes=1,
                           plane=None, unit=None, pid=os.getpid())
        assert name == f"{NAME}.PressureTooHigh"
        acquire(daemon, "EmergencyTriage", 1, pid=os.getpid())


def test_bad_input_is_declared_and_changes_nothing(tmp_path: Path) -> None:
    with inferenced(tmp_path) as daemon:
        for params, parameter in [
            ({"priority": "Urgent", "memory_bytes": 1}, "priority"),
            ({"priority": "Batch", "memory_bytes": -1}, "memory_bytes"),
            ({"priority": "Batch", "memory_bytes": 1 << 62}, "memory_bytes"),
            ({"priority": "Batch", "memory_bytes": 1, "pid": 2**31 - 1}, "pid"),
        ]:
            full = {"plane": None, "unit": None, "pid": None} | params
            assert error_of(daemon, "AcquireLease", **full) == (
                f"{NAME}.InvalidParameter", {"parameter": parameter})
        assert error_of(daemon, "AcquireLease", priority="Batch", memory_bytes=1,
                        plane="gpu9", unit=None, pid=None) == (
            f"{NAME}.PlaneNotFound", {"plane": "gpu9"})
        assert error_of(daemon, "ReleaseLease", lease_id="nope") == (
            f"{NAME}.LeaseNotFound", {"lease_id": "nope"})
        too_big = error_of(daemon, "AcquireLease", priority="Batch", memory_bytes=1 << 49,
                           plane="cpu", unit=None, pid=os.getpid())
        assert too_big[0] == f"{NAME}.ResourceExhaustion"
        assert too_big[1]["plane"] == "cpu" and too_big[1]["requested"] == 1 << 49
        for slices in ([], [{"plane_id": "cpu", "role": "tensor", "stage_index": None,
                             "memory_bytes": 1}] * 2):
            assert error_of(daemon, "AcquireCompositeLease", gang_id="g", slices=slices,
                            gang_policy="all-or-nothing", priority="Batch",
                            client_unit=None) == (
                f"{NAME}.InvalidParameter", {"parameter": "slices"})
        assert call(daemon, "ListLeases")["leases"] == []
        assert call(daemon, "ListCompositeLeases")["leases"] == []


def test_lease_dies_with_its_process(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    with inferenced(tmp_path) as daemon:
        lease = acquire(daemon, "Interactive", 1 << 20, pid=sleeper.pid)
        (listed,) = call(daemon, "ListLeases")["leases"]
        assert listed["id"] == lease["lease_id"] and listed["client_pid"] == sleeper.pid
        sleeper.kill()
        sleeper.wait()
        deadline = time.monotonic() + 5
        while call(daemon, "ListLeases")["leases"]:
            assert time.monotonic() < deadline, "lease outlived its process"
            time.sleep(0.02)


def test_leases_survive_kill_9_and_dead_clients_are_dropped(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    short = subprocess.Popen(["sleep", "60"])
    with inferenced(tmp_path) as daemon:
        kept = acquire(daemon, "Batch", 1 << 20, pid=sleeper.pid)
        acquire(daemon, "Batch", 1 << 20, pid=short.pid)
        os.kill(daemon.process.pid, signal.SIGKILL)
        daemon.process.wait()
    short.kill()
    short.wait()
    with inferenced(tmp_path) as daemon:
        leases = call(daemon, "ListLeases")["leases"]
    assert [lease["id"] for lease in leases] == [kept["lease_id"]]


def test_sealed_memfd_buffer_of_a_cpu_lease(tmp_path: Path) -> None:
    async def main(address: str) -> None:
        async with await connect(Inference1, address=address) as client:
            lease = await client.AcquireLease(priority="Interactive", memory_bytes=1 << 20,
                                              plane="cpu", unit=None, pid=os.getpid())
            with await client.AcquireBuffer(lease_id=lease["lease_id"]) as reply:
                fd = os.dup(reply["buffer"].fileno())
            assert reply["size"] == 1 << 20
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
            with mmap.mmap(fd, 1 << 20) as view:
                view[:5] = b"hello"
            assert os.pread(fd, 5, 0) == b"hello"
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 4096)
            os.close(fd)
            # A second buffer of the same lease is the same memory.
            with await client.AcquireBuffer(lease_id=lease["lease_id"]) as again:
                assert os.pread(again["buffer"].fileno(), 5, 0) == b"hello"

    with inferenced(tmp_path) as daemon:
        asyncio.run(main(daemon.address))


def test_gang_placement_on_four_gpus(tmp_path: Path) -> None:
    tree = fakesysfs.four_gpu_box(tmp_path / "tree")
    open_slice = {"plane_id": "", "role": "tensor", "stage_index": None, "memory_bytes": 8 * GiB}
    with inferenced(tmp_path, f'root = "{tree}"\n') as daemon:
        reply = call(daemon, "AcquireCompositeLease", gang_id="tp", slices=[open_slice] * 2,
                     gang_policy="all-or-nothing", priority="Interactive", client_unit=None)
        planes = sorted(s["plane_id"] for s in reply["allocated_slices"])
        # The two GPUs behind one switch, on one NUMA node.
        assert planes in (["drm-renderD128", "drm-renderD129"],
                          ["drm-renderD130", "drm-renderD131"])
        (listed,) = call(daemon, "ListCompositeLeases")["leases"]
        assert listed["gang_id"] == "tp" and listed["lease_id"] == reply["lease_id"]
        # All or nothing: 3 more GPUs of 60 GiB do not exist now.
        big = dict(open_slice, memory_bytes=60 * GiB)
        name, _ = error_of(daemon, "AcquireCompositeLease", gang_id="x", slices=[big] * 3,
                           gang_policy="all-or-nothing", priority="Batch", client_unit=None)
        assert name == f"{NAME}.ResourceExhaustion"
        assert len(call(daemon, "ListCompositeLeases")["leases"]) == 1
        call(daemon, "ReleaseLease", lease_id=reply["lease_id"])
        assert call(daemon, "ListCompositeLeases")["leases"] == []


def test_models_quarantine_and_stream(tmp_path: Path) -> None:
    with inferenced(tmp_path) as daemon:
        call(daemon, "RegisterModel", id="smol", format="gguf", path="/m/smol.gguf",
             estimated_bytes=200 << 20)
        (model,) = call(daemon, "ListModels")["models"]
        assert model["placement"] == "cpu" and model["estimated_memory"] == 200 << 20
        assert error_of(daemon, "RegisterModel", id="../x", format="gguf", path="/m",
                        estimated_bytes=1)[1] == {"parameter": "id"}
        call(daemon, "Quarantine", plane="cpu", reason="test")
        planes = call(daemon, "GetTopology")["planes"]
        assert planes[-1]["quarantined"] == "test"
        assert error_of(daemon, "AcquireLease", priority="EmergencyTriage", memory_bytes=1,
                        plane="cpu", unit=None, pid=None)[0] == f"{NAME}.PlaneQuarantined"
        call(daemon, "Unquarantine", plane="cpu")
        with (
            varlink.Client(address=daemon.address) as client,
            client.open(NAME) as iface,
            pytest.raises(varlink.VarlinkError) as caught,
        ):
            list(iface.StreamInference(model="smol", prompt="hi", _more=True))
        assert caught.value.error() == f"{NAME}.RuntimeUnavailable"


def _cgroup_sandbox() -> Path | None:
    mount = cgroup.find_mount()
    if mount is None or os.geteuid() != 0:
        return None
    sandbox = mount / f"syntrop-test-{os.getpid()}"
    try:
        sandbox.mkdir()
    except OSError:
        return None
    return sandbox


def test_emergency_freezes_the_victims_cgroup_and_thaws_it(tmp_path: Path) -> None:
    sandbox = _cgroup_sandbox()
    if sandbox is None:
        pytest.skip("needs root and a writable cgroup2 mount")
    victim = sandbox / "victim"
    victim.mkdir()
    process = subprocess.Popen(["sleep", "60"])
    try:
        (victim / "cgroup.procs").write_text(str(process.pid))
        with inferenced(tmp_path) as daemon:
            total = call(daemon, "GetTopology")["total_ram"]
            batch = acquire(daemon, "Batch", total * 3 // 4, plane="cpu", pid=process.pid)
            emergency = acquire(daemon, "EmergencyTriage", total // 2, plane="cpu",
                                pid=os.getpid())
            states = {lease["id"]: lease["state"] for lease in call(daemon, "ListLeases")["leases"]}
            assert states == {batch["lease_id"]: "frozen", emergency["lease_id"]: "active"}
            assert cgroup.is_frozen(victim)
            call(daemon, "ReleaseLease", lease_id=emergency["lease_id"])
            assert not cgroup.is_frozen(victim)
            (listed,) = call(daemon, "ListLeases")["leases"]
            assert listed["state"] == "active"
            # Explicit Freeze/Thaw by the owner.
            call(daemon, "Freeze", lease_id=batch["lease_id"])
            assert cgroup.is_frozen(victim)
            call(daemon, "Thaw", lease_id=batch["lease_id"])
            assert not cgroup.is_frozen(victim)
    finally:
        with contextlib.suppress(OSError):
            cgroup.set_frozen(victim, False)
        process.kill()
        process.wait()
        for directory in (victim, sandbox):
            deadline = time.monotonic() + 5
            while directory.exists():
                try:
                    directory.rmdir()
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)


def test_a_root_process_entering_a_users_leased_cgroup_is_never_frozen() -> None:
    """nobody leases its own cgroup; a root process enters it afterwards.
    Freezing that lease is refused, and an EmergencyTriage grant preempts
    it in the books only: the cgroup stays thawed."""
    require_nobody_can_run_us()
    sandbox = _cgroup_sandbox()
    if sandbox is None:
        pytest.skip("needs root and a writable cgroup2 mount")
    victim = sandbox / "victim"
    victim.mkdir()
    shared = Path(tempfile.mkdtemp(prefix="syntrop-toctou-"))
    started: list[subprocess.Popen[str]] = []
    try:
        shared.chmod(0o755)
        with inferenced(shared) as daemon:
            (shared / "run").chmod(0o755)
            daemon.socket.chmod(0o666)
            total = call(daemon, "GetTopology")["total_ram"]
            client = _nobody_leasing_in(victim, daemon, total * 3 // 4)
            started.append(client)
            assert client.stdout is not None
            lease_id = client.stdout.readline().strip()
            assert lease_id.startswith("lease-"), client.stderr and client.stderr.read()
            intruder = subprocess.Popen(["sleep", "60"], text=True)
            started.append(intruder)
            (victim / "cgroup.procs").write_text(str(intruder.pid))  # after the grant

            name, _ = error_of(daemon, "Freeze", lease_id=lease_id)
            assert name == f"{NAME}.NotAuthorized"
            assert not cgroup.is_frozen(victim)
            emergency = acquire(daemon, "EmergencyTriage", total // 2, plane="cpu",
                                pid=os.getpid())
            states = {lease["id"]: lease["state"] for lease in call(daemon, "ListLeases")["leases"]}
            assert states == {lease_id: "frozen", emergency["lease_id"]: "active"}
            assert not cgroup.is_frozen(victim)
            call(daemon, "ReleaseLease", lease_id=emergency["lease_id"])
            call(daemon, "Thaw", lease_id=lease_id)
    finally:
        with contextlib.suppress(OSError):
            cgroup.set_frozen(victim, False)
        for process in started:
            process.kill()
            process.communicate()  # and its pipes closed
        shutil.rmtree(shared)
        for directory in (victim, sandbox):
            deadline = time.monotonic() + 5
            while directory.exists():
                try:
                    directory.rmdir()
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)


def _nobody_leasing_in(group: Path, daemon: Activated, memory: int) -> "subprocess.Popen[str]":
    """A client in cgroup `group` that turns nobody, leases its own process
    (printing the lease id) and waits for its stdin to close."""
    script = (
        "import os, sys, varlink\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        f"c = varlink.Client(address={daemon.address!r})\n"
        f"i = c.open({NAME!r})\n"
        f"r = i.AcquireLease(priority='Batch', memory_bytes={memory}, plane='cpu',"
        " unit=None, pid=None)\n"
        "print(r['lease_id'], flush=True)\n"
        "sys.stdin.read()\n"
    )

    def enter() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=enter)


def test_freeze_of_someone_elses_lease_is_permission_denied() -> None:
    require_nobody_can_run_us()
    # pytest's tmp_path is private to root: use a directory nobody can reach.
    shared = Path(tempfile.mkdtemp(prefix="syntrop-perm-"))
    try:
        shared.chmod(0o755)
        with inferenced(shared) as daemon:
            (shared / "run").chmod(0o755)
            daemon.socket.chmod(0o666)
            _freeze_as_nobody(daemon)
    finally:
        shutil.rmtree(shared)


def _freeze_as_nobody(daemon: Activated) -> None:
    lease = acquire(daemon, "Batch", 1 << 20, pid=os.getpid())
    script = (
        "import os, varlink, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"c = varlink.Client(address={daemon.address!r})\n"
        f"i = c.open({NAME!r})\n"
        "try:\n"
        f"    i.Freeze(lease_id={lease['lease_id']!r})\n"
        "except varlink.VarlinkError as e:\n"
        "    print(e.error())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=30)
    assert out.stdout.strip() == "io.syntrop.Inference1.NotAuthorized", out.stderr
    (listed,) = call(daemon, "ListLeases")["leases"]
    assert listed["state"] == "active"
