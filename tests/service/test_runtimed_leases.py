"""Every resident model holds an inferenced lease (runtimed/leases.py),
against a real inferenced, modeld and runtimed, socket-activated: the lease
names the worker's pid and the model's real need, the triage lane has a
worker and an EmergencyTriage lease of its own, unloading releases both,
a model larger than the plane is refused with a declared error naming the
plane, and GetEngine reports the placement each worker applied. (Freezing
a worker's own cgroup needs systemd's delegation: the system tier shows
that.)"""

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import varlink

from syntrop.runtimed.residency import OTHERS_NICE
from tests.models import model_node, require_llama, smollm2
from tests.support import Activated, activated

require_llama()

RUNTIME, INFERENCE = "io.syntrop.Runtime1", "io.syntrop.Inference1"


def call(daemon: Activated, interface: str, method: str, **params: Any) -> Any:
    with varlink.Client(address=daemon.address) as client, client.open(interface) as proxy:
        return getattr(proxy, method)(**params)


def generate(runtimed: Activated, **extra: Any) -> list[dict[str, Any]]:
    with varlink.Client(address=runtimed.address) as client, client.open(RUNTIME) as proxy:
        return list(proxy.Complete(model="smollm2", prompt="One, two,", _more=True,
                                   sampling={"max_tokens": 2, "temperature": 0}, **extra))


def nice(pid: int) -> int:
    """A process's nice value (field 19 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[16])


def leases(inferenced: Activated) -> list[dict[str, Any]]:
    return list(call(inferenced, INFERENCE, "ListLeases")["leases"])


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Activated]]:
    with ExitStack() as stack:
        inferenced = stack.enter_context(activated("inferenced", tmp_path))
        runtimed = stack.enter_context(model_node(tmp_path, stack))
        yield {"inferenced": inferenced, "runtimed": runtimed}


def test_a_resident_model_holds_a_lease_of_its_real_need(node: dict[str, Activated]) -> None:
    generate(node["runtimed"])
    (worker,) = call(node["runtimed"], RUNTIME, "GetEngine")["workers"]
    (lease,) = leases(node["inferenced"])
    size = smollm2().stat().st_size
    assert worker["lease_id"] == lease["id"] and lease["client_pid"] == worker["pid"]
    assert lease["priority"] == "Interactive" and lease["plane_id"] == "cpu"
    # weights + a KV cache for every slot + compute: more than the file.
    assert lease["allocated_memory"] == worker["lease_bytes"] > size + (64 << 20)
    # The triage lane: a worker and an EmergencyTriage lease of its own.
    generate(node["runtimed"], priority="EmergencyTriage")
    workers = call(node["runtimed"], RUNTIME, "GetEngine")["workers"]
    triage = next(w for w in workers if w.get("lane") == "triage")
    assert triage["model"] == "smollm2" and triage["pid"] != worker["pid"]
    by_pid = {lease["client_pid"]: lease for lease in leases(node["inferenced"])}
    assert by_pid[triage["pid"]]["priority"] == "EmergencyTriage"
    # A single context: it needs less than the main worker's four.
    assert by_pid[triage["pid"]]["allocated_memory"] < lease["allocated_memory"]
    # The triage worker outweighs the others for the CPU: they run nicer.
    assert nice(triage["pid"]) + OTHERS_NICE == nice(worker["pid"])
    with pytest.raises(varlink.VarlinkError) as caught:
        generate(node["runtimed"], priority="Urgent")
    assert caught.value.error() == "org.varlink.service.InvalidParameter"
    # Unloading releases every lease.
    unloaded = call(node["runtimed"], RUNTIME, "Unload", model="smollm2")
    assert sorted(unloaded["unloaded"]) == ["smollm2", "smollm2 (triage)"]
    deadline = time.monotonic() + 10
    while leases(node["inferenced"]):
        assert time.monotonic() < deadline, leases(node["inferenced"])
        time.sleep(0.05)


def test_a_loaded_model_reports_the_placement_it_runs_with(node: dict[str, Activated]) -> None:
    # This host has no GPU: the CPU lease's placement, every layer on the
    # host, unpinned (inferenced's CPU plane names no NUMA node), threads
    # as free when the worker loaded the model.
    generate(node["runtimed"])
    (worker,) = call(node["runtimed"], RUNTIME, "GetEngine")["workers"]
    placed = worker["placement"]
    assert (placed["n_gpu_layers"], placed["split_mode"], placed["main_gpu"]) == (0, "none", 0)
    assert placed.get("tensor_split") is None and placed.get("cpu_affinity") is None
    assert 0 < placed["n_threads"] <= (os.cpu_count() or 1)
    assert placed["why"].startswith("CPU lease on cpu: all 30 layers on the host; not pinned")


def test_a_model_larger_than_the_plane_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir(parents=True)
    (tmp_path / "config" / "inferenced.toml").write_text(
        f"[devices.cpu]\nmemory_bytes = {100 << 20}\n")
    with ExitStack() as stack:
        inferenced = stack.enter_context(activated("inferenced", tmp_path))
        runtimed = stack.enter_context(model_node(tmp_path, stack))
        with pytest.raises(varlink.VarlinkError) as caught:
            generate(runtimed)
        assert caught.value.error() == "io.syntrop.Runtime1.InsufficientMemory"
        params = caught.value.parameters()
        assert params["model"] == "smollm2" and params["plane"] == "cpu"
        assert params["reason"] == "ResourceExhaustion"
        assert params["needed_bytes"] > params["available_bytes"] > 0
        assert leases(inferenced) == []
        assert call(runtimed, RUNTIME, "GetEngine")["workers"] == []  # no worker left
