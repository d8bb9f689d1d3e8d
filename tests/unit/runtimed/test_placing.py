"""The placement a worker is sent and the Llama kwargs it then loads with
(placing.py, protocol.Placed, worker/engine.llama_kwargs), on the fake
sysfs trees of the placement tests: a CPU-only host (the plane's cores, no
pinning), a CPU plane on a NUMA node (pinned, threads capped), two GPUs
(layer split over both), and the fallbacks (unleased, a lease placement
cannot use)."""

import json
from pathlib import Path

from syntrop.inferenced.topology import scan
from syntrop.runtimed import leases, placing
from syntrop.runtimed import placement as pl
from syntrop.runtimed.placement import Grant, PlaneView, Slice
from syntrop.runtimed.protocol import Options, Placed
from syntrop.runtimed.worker.engine import llama_kwargs
from tests import fakesysfs
from tests.fakesysfs import GiB
from tests.unit.runtimed.test_placement import (
    SMOLLM2,
    SMOLLM2_SIZE,
    TWO_GPU_CONFIG,
    two_gpu_box,
    with_cpus,
)

#: What every context of these tests asks for (runtimed's defaults).
OPTIONS = Options(n_ctx=2048, n_batch=512)
#: The kwargs that do not depend on the placement, for a model behind fd 7.
CONTEXT = {"model_path": "/proc/self/fd/7", "n_ctx": 2048, "n_batch": 512, "flash_attn": False,
           "type_k": 1, "type_v": 1, "embedding": False, "pooling_type": -1,
           "vocab_only": False, "verbose": False}


def sent(placed: Placed) -> Placed:
    """`placed` as the worker reads it from the load request's JSON."""
    return Placed.from_wire(json.loads(json.dumps(placed.to_wire())))


def test_a_cpu_lease_on_a_cpu_only_host_takes_the_free_cores_unpinned(tmp_path: Path) -> None:
    root = with_cpus(fakesysfs.build(tmp_path, [], numa=["10"]), {0: "0-7"}, 8)
    placed = placing.for_lease(Grant.single("cpu", 8 * GiB), SMOLLM2, SMOLLM2_SIZE, n_ctx=2048,
                               slots=4, planes=scan(root).planes, root=root)
    # inferenced's CPU plane names no NUMA node: no pinning and no cap, the
    # threads are the plane's cores (cpu.plane_threads).
    assert (placed.n_gpu_layers, placed.split_mode, placed.tensor_split) == (0, 0, None)
    assert (placed.n_threads, placed.cpu_affinity) == (0, None)
    assert placed.why == ("CPU lease on cpu: all 30 layers on the host; "
                          "not pinned, threads: the plane's cores (cpu.plane_threads)")
    assert llama_kwargs(7, OPTIONS, sent(placed), free=5) == {
        **CONTEXT, "n_gpu_layers": 0, "split_mode": 0, "main_gpu": 0,
        "n_threads": 5, "n_threads_batch": 5}
    # A context's own thread count stands.
    assert llama_kwargs(7, Options(n_threads=3), sent(placed), free=5)["n_threads"] == 3


def test_a_cpu_plane_on_a_numa_node_pins_and_caps_the_threads() -> None:
    planes = [PlaneView(id="cpu", kind="cpu", device_index=None, numa_node=1, cpus=(4, 5))]
    grant = Grant.single("cpu", GiB)
    shape = pl.shape_from_gguf(SMOLLM2, SMOLLM2_SIZE, n_ctx=2048)
    placed = placing.applied(pl.place(shape, grant, planes), grant, planes)
    assert (placed.n_threads, placed.cpu_affinity) == (2, (4, 5))
    assert "pinned to the 2 cores of NUMA node 1" in placed.why
    kwargs = llama_kwargs(7, OPTIONS, sent(placed), free=8)
    # Never more threads than the cores it is pinned to.
    assert (kwargs["n_threads"], kwargs["n_threads_batch"]) == (2, 2)
    assert llama_kwargs(7, OPTIONS, sent(placed), free=1)["n_threads"] == 1


def test_a_two_gpu_lease_gives_the_worker_a_layer_split(tmp_path: Path) -> None:
    root = two_gpu_box(tmp_path)
    slices = [Slice(plane_id="drm-renderD128", memory_bytes=8 * GiB, role="pipeline",
                    stage_index=0),
              Slice(plane_id="drm-renderD129", memory_bytes=4 * GiB, role="pipeline",
                    stage_index=1)]
    placed = placing.for_lease(Grant.from_slices(slices), SMOLLM2, SMOLLM2_SIZE, n_ctx=2048,
                               slots=4, planes=scan(root, TWO_GPU_CONFIG).planes, root=root)
    kwargs = llama_kwargs(7, OPTIONS, sent(placed), free=3)
    # renderD129 is device 0 (the lower PCI address), renderD128 device 1:
    # stage 0 on device 1 is the main GPU; shares by each slice's room less
    # the compute and context reserve; all 30 blocks and the head (31 slots).
    reserve = leases.COMPUTE_MIN + pl.GPU_CONTEXT_BYTES  # a tenth of 94 MiB is less
    room = [8 * GiB - reserve, 4 * GiB - reserve]
    shares = [room[1] / sum(room), room[0] / sum(room)]
    assert kwargs == {**CONTEXT, "n_gpu_layers": 31, "split_mode": 1, "main_gpu": 1,
                      "tensor_split": shares, "n_threads": 3, "n_threads_batch": 3}
    # Both GPUs sit on NUMA node 0 (cores 0-7): pinned there, at most 8 threads.
    assert (placed.n_threads, placed.cpu_affinity) == (8, tuple(range(8)))
    assert llama_kwargs(7, OPTIONS, sent(placed), free=16)["n_threads"] == 8
    # A context may ask for fewer GPU layers than its lease holds, never more.
    assert llama_kwargs(7, Options(n_gpu_layers=10), sent(placed), free=3)["n_gpu_layers"] == 10
    assert llama_kwargs(7, Options(n_gpu_layers=99), sent(placed), free=3)["n_gpu_layers"] == 31
    assert placed.why.startswith("2 GPUs pipeline (layer split)")


def test_without_a_usable_lease_the_model_runs_on_the_cpu_unpinned(tmp_path: Path) -> None:
    root = with_cpus(fakesysfs.build(tmp_path, [], numa=["10"]), {0: "0-3"}, 4)
    unleased = placing.for_lease(None, SMOLLM2, SMOLLM2_SIZE, n_ctx=2048, slots=4, planes=[])
    assert unleased == Placed(why="unleased: on the CPU, not pinned, threads: the plane's "
                                  "cores (cpu.plane_threads)")
    # A lease on a plane the host does not show, or a header without layers.
    for grant, metadata in ((Grant.single("drm-renderD200", GiB), SMOLLM2),
                            (Grant.single("cpu", GiB), {})):
        placed = placing.for_lease(grant, metadata, SMOLLM2_SIZE, n_ctx=2048, slots=4,
                                   planes=scan(root).planes, root=root)
        assert (placed.n_gpu_layers, placed.n_threads, placed.cpu_affinity) == (0, 0, None)
        assert placed.why.startswith("not placed")
    assert llama_kwargs(7, OPTIONS, sent(unleased), free=2) == {
        **CONTEXT, "n_gpu_layers": 0, "split_mode": 0, "main_gpu": 0,
        "n_threads": 2, "n_threads_batch": 2}


def test_node_cpus_reads_each_node_and_skips_the_unreadable(tmp_path: Path) -> None:
    root = with_cpus(tmp_path, {0: "0-3", 1: "4-7"}, 8)
    fakesysfs.write(root / placing.NODES / "node2" / "cpulist", "garbage\n")
    assert placing.node_cpus(root) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert placing.node_cpus(tmp_path / "nowhere") == {}
