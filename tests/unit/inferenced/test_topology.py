"""Topology from fake sysfs trees shaped like real hosts, and from this host."""

import itertools
from pathlib import Path

from syntrop.inferenced.topology import DeviceConfig, TopologyConfig, choose, distance, scan
from tests import fakesysfs
from tests.fakesysfs import GiB


def test_nvidia_box_without_nvml_takes_memory_from_config(tmp_path: Path) -> None:
    root = fakesysfs.nvidia_box(tmp_path)
    bare = scan(root)
    gpu = bare.plane("drm-renderD128")
    assert gpu is not None and gpu.kind == "drm_gpu"
    assert gpu.name.startswith("NVIDIA GPU 0x2684 (nvidia, 0000:01:00.0)")
    assert gpu.total_memory == 0  # nobody said: nothing is placed on it
    configured = scan(root, TopologyConfig(devices={
        "drm-renderD128": DeviceConfig(name="Big GPU", memory_bytes=24 * GiB)}))
    gpu = configured.plane("drm-renderD128")
    assert gpu is not None and (gpu.name, gpu.total_memory) == ("Big GPU", 24 * GiB)


def test_nvidia_gpus_without_render_nodes_are_planes_of_their_own(tmp_path: Path) -> None:
    """A VM: /dev/nvidiaN and nvidia-smi, no DRM render node. Each GPU is a
    plane with its memory, PCI address and NUMA node; the extra device
    nodes (nvidiactl, nvidia-uvm) are not GPUs."""
    topology = scan(fakesysfs.nvidia_vm(tmp_path))
    gpus = [p for p in topology.planes if p.kind == "nvidia_gpu"]
    assert [p.id for p in gpus] == ["nvidia-0", "nvidia-1"]
    first, second = gpus
    assert first.name == "NVIDIA H100 80GB HBM3 (0000:65:00.0)"
    assert (first.total_memory, first.used_memory, first.numa_node) == (81559 << 20, 1 << 20, 0)
    assert (second.used_memory, second.numa_node) == (40000 << 20, 1)
    assert second.pci_chain == ("0000:e4:00.0",)
    # Configuration still names and sizes them.
    sized = scan(tmp_path, TopologyConfig(devices={"nvidia-1": DeviceConfig(memory_bytes=GiB)}))
    plane = sized.plane("nvidia-1")
    assert plane is not None and plane.total_memory == GiB


def test_no_nvidia_smi_or_no_device_node_means_no_nvidia_plane(tmp_path: Path) -> None:
    assert not [p for p in scan(fakesysfs.nvidia_vm(tmp_path / "a", smi=None)).planes
                if p.kind == "nvidia_gpu"]
    bare = fakesysfs.nvidia_vm(tmp_path / "b")
    for node in ("nvidia0", "nvidia1"):
        (bare / "dev" / node).unlink()
    assert [p.id for p in scan(bare).planes] == ["cpu"]
    garbled = fakesysfs.nvidia_vm(tmp_path / "c", smi="No devices were found\n")
    assert [p.id for p in scan(garbled).planes] == ["cpu"]


def test_a_gpu_with_a_render_node_is_not_listed_twice(tmp_path: Path) -> None:
    root = fakesysfs.nvidia_box(tmp_path)  # renderD128 at 0000:01:00.0
    fakesysfs.write(root / "dev" / "nvidia0", "")
    program = root / "usr" / "bin" / "nvidia-smi"
    fakesysfs.write(program, "#!/bin/sh\necho '0, NVIDIA L4, 00000000:01:00.0, 23034, 0'\n")
    program.chmod(0o755)
    assert [p.id for p in scan(root).planes] == ["drm-renderD128", "cpu"]


def test_amd_box_reads_vram_from_amdgpu(tmp_path: Path) -> None:
    topology = scan(fakesysfs.amd_box(tmp_path))
    gpu = topology.plane("drm-renderD128")
    assert gpu is not None
    assert (gpu.total_memory, gpu.used_memory, gpu.numa_node) == (24 * GiB, 2 * GiB, 0)
    cpu = topology.plane("cpu")
    assert cpu is not None and cpu.name == "Test CPU 9000 (avx2, avx512f, avx512_vnni)"
    assert topology.cpu_cores == 2 and topology.total_ram == 64 * GiB


def test_npu_is_an_accel_plane(tmp_path: Path) -> None:
    topology = scan(fakesysfs.npu_box(tmp_path))
    assert [p.id for p in topology.planes] == ["accel-accel0", "cpu"]
    npu = topology.plane("accel-accel0")
    assert npu is not None and npu.kind == "npu" and "Intel NPU" in npu.name


def test_triage_reservation(tmp_path: Path) -> None:
    topology = scan(fakesysfs.amd_box(tmp_path),
                    TopologyConfig(triage_plane="drm-renderD128", triage_reserve_bytes=4 * GiB))
    gpu = topology.plane("drm-renderD128")
    assert gpu is not None and gpu.triage_reserve == 4 * GiB


def test_four_gpu_box_affinity(tmp_path: Path) -> None:
    topology = scan(fakesysfs.four_gpu_box(tmp_path))
    gpus = {p.id: p for p in topology.planes if p.kind == "drm_gpu"}
    assert len(gpus) == 4
    numa = topology.numa_distances
    assert numa == {0: [10, 21], 1: [21, 10]}
    same_switch = distance(gpus["drm-renderD128"], gpus["drm-renderD129"], numa)
    across = distance(gpus["drm-renderD128"], gpus["drm-renderD130"], numa)
    assert same_switch < across
    pair = choose(list(gpus.values()), 2, numa, pipeline=False)
    assert pair is not None
    assert {p.numa_node for p in pair} == {0} or {p.numa_node for p in pair} == {1}
    chain = choose(list(gpus.values()), 4, numa, pipeline=True)
    assert chain is not None
    # The chain crosses between NUMA nodes exactly once.
    crossings = sum(a.numa_node != b.numa_node for a, b in itertools.pairwise(chain))
    assert crossings == 1
    assert choose(list(gpus.values()), 5, numa, pipeline=False) is None


def test_this_host_has_a_cpu_plane() -> None:
    topology = scan(Path("/"))
    cpu = topology.plane("cpu")
    assert cpu is not None
    assert cpu.total_memory == topology.total_ram > 0
    assert topology.cpu_cores >= 1
