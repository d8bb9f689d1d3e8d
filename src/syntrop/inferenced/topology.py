"""Compute planes of a host, and how close they are to each other.

A plane is a DRM render node (GPU), an accel node (NPU), an NVIDIA GPU
that has no render node (virtual machines, hosts without nvidia-drm: its
/dev/nvidiaN and nvidia-smi say it is there), or the CPU with host RAM.
Memory of a GPU comes from its driver's sysfs (amdgpu
mem_info_vram_total/used), from NVML when nvidia-ml-py is importable, from
nvidia-smi for a GPU without a render node, or from
configuration; a device whose memory nobody reports is listed with total 0,
so nothing is placed on it until config says how much it has.

Affinity: two planes are close when their PCI paths share a long prefix
(same switch) and their NUMA nodes are near. distance(a, b) =
10 * PCIe hops between them + the NUMA distance (10 local, 20+ remote).
"""

import itertools
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from syntrop.system import sysfs


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceConfig:
    name: str | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyConfig:
    """The [topology] part of inferenced.toml."""

    devices: dict[str, DeviceConfig] = field(default_factory=dict)
    #: Plane kept for EmergencyTriage, and how many bytes of it (0: all).
    triage_plane: str | None = None
    triage_reserve_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaneInfo:
    id: str
    name: str
    kind: str
    total_memory: int
    used_memory: int
    numa_node: int | None
    pci_chain: tuple[str, ...]
    triage_reserve: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    planes: list[PlaneInfo]
    total_ram: int
    available_ram: int
    cpu_cores: int
    vector_extensions: list[str]
    numa_distances: dict[int, list[int]]

    def plane(self, plane_id: str) -> PlaneInfo | None:
        return next((p for p in self.planes if p.id == plane_id), None)


def _nvml_memory(address: str) -> tuple[int, int] | None:
    """(total, used) from NVML for a PCI address, when the library is there."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(address)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used)
    except Exception:  # the library raises its own error types
        return None


#: What nvidia-smi is asked, one CSV line per GPU.
NVIDIA_QUERY = "index,name,pci.bus_id,memory.total,memory.used"
NVIDIA_TIMEOUT = 5.0
MiB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class NvidiaGpu:
    """One GPU as nvidia-smi lists it (memory in bytes)."""

    index: int
    name: str
    address: str
    total: int
    used: int


def parse_nvidia_smi(text: str) -> list[NvidiaGpu]:
    """nvidia-smi --query-gpu=NVIDIA_QUERY --format=csv,noheader,nounits;
    lines it cannot read are left out."""
    found = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            continue
        try:
            found.append(NvidiaGpu(index=int(fields[0]), name=fields[1],
                                   address=sysfs.pci_address(fields[2]),
                                   total=int(float(fields[3]) * MiB),
                                   used=int(float(fields[4]) * MiB)))
        except ValueError:
            continue
    return found


def _nvidia_smi(root: Path) -> list[NvidiaGpu]:
    """The GPUs nvidia-smi lists (under `root`'s /usr/bin or /bin for a
    test tree); none when it is missing, fails or hangs."""
    import shutil  # here: with bz2 and lzma it costs every cold start ~2 ms

    search = None if root == Path("/") else f"{root}/usr/bin{os.pathsep}{root}/bin"
    program = shutil.which("nvidia-smi", path=search)
    if program is None:
        return []
    try:
        done = subprocess.run([program, f"--query-gpu={NVIDIA_QUERY}",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=NVIDIA_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


def nvidia_without_render_node(root: Path, known: set[str]) -> list[sysfs.Accelerator]:
    """NVIDIA GPUs that the driver's /dev/nvidiaN nodes say exist and that
    no DRM render node (PCI address in `known`) already stands for: from
    nvidia-smi, NVML's memory where it is importable, NUMA node and PCI
    path from sysfs."""
    if not sysfs.nvidia_minors(root):
        return []
    found = []
    for gpu in _nvidia_smi(root):
        if gpu.address in known:
            continue
        pci = sysfs.pci_device(root / "sys" / "bus" / "pci" / "devices" / gpu.address)
        total, used = _nvml_memory(gpu.address) or (gpu.total, gpu.used)
        found.append(sysfs.Accelerator(id=f"nvidia-{gpu.index}", node=gpu.name,
                                       kind="nvidia_gpu", pci=pci, vram_total=total,
                                       vram_used=used))
    return found


def _device_name(accelerator: sysfs.Accelerator) -> str:
    pci = accelerator.pci
    if accelerator.kind == "nvidia_gpu":
        return accelerator.node + (f" ({pci.address})" if pci else "")  # nvidia-smi's name
    if pci is None:
        return accelerator.node
    vendor = sysfs.VENDORS.get(pci.vendor, pci.vendor)
    kind = "NPU" if accelerator.kind == "npu" else "GPU"
    return f"{vendor} {kind} {pci.device} ({pci.driver or 'no driver'}, {pci.address})"


def scan(root: Path = Path("/"), config: TopologyConfig | None = None) -> Topology:
    config = config or TopologyConfig()
    cpu = sysfs.cpu(root)
    mem = sysfs.memory(root)
    planes: list[PlaneInfo] = []
    rendered = sysfs.accelerators(root)
    known = {a.pci.address for a in rendered if a.pci is not None}
    for accelerator in rendered + nvidia_without_render_node(root, known):
        configured = config.devices.get(accelerator.id, DeviceConfig())
        total, used = accelerator.vram_total, accelerator.vram_used
        if total is None and accelerator.pci is not None and accelerator.pci.vendor == "0x10de":
            nvml = _nvml_memory(accelerator.pci.address)
            if nvml is not None:
                total, used = nvml
        if configured.memory_bytes is not None:
            total = configured.memory_bytes
        planes.append(
            PlaneInfo(
                id=accelerator.id,
                name=configured.name or _device_name(accelerator),
                kind=accelerator.kind,
                total_memory=total or 0,
                used_memory=used or 0,
                numa_node=accelerator.pci.numa_node if accelerator.pci else None,
                pci_chain=accelerator.pci.chain if accelerator.pci else (),
                triage_reserve=0,
            )
        )
    extensions = sysfs.vector_extensions(cpu)
    cpu_name = cpu.model + (f" ({', '.join(extensions)})" if extensions else "")
    # [devices.cpu] memory_bytes: the host RAM leases may hold (default all).
    host = config.devices.get("cpu", DeviceConfig())
    planes.append(
        PlaneInfo(
            id="cpu",
            name=host.name or cpu_name,
            kind="cpu",
            total_memory=host.memory_bytes if host.memory_bytes is not None else mem.total,
            used_memory=max(0, mem.total - mem.available),
            numa_node=None,
            pci_chain=(),
            triage_reserve=0,
        )
    )
    if config.triage_plane is not None:
        planes = [
            _reserve(plane, config.triage_reserve_bytes)
            if plane.id == config.triage_plane
            else plane
            for plane in planes
        ]
    return Topology(
        planes=planes,
        total_ram=mem.total,
        available_ram=mem.available,
        cpu_cores=cpu.cores,
        vector_extensions=extensions,
        numa_distances=sysfs.numa_distances(root),
    )


def _reserve(plane: PlaneInfo, reserve: int) -> PlaneInfo:
    amount = plane.total_memory if reserve <= 0 else min(reserve, plane.total_memory)
    return PlaneInfo(
        id=plane.id, name=plane.name, kind=plane.kind, total_memory=plane.total_memory,
        used_memory=plane.used_memory, numa_node=plane.numa_node,
        pci_chain=plane.pci_chain, triage_reserve=amount,
    )


# affinity ------------------------------------------------------------------


def distance(a: PlaneInfo, b: PlaneInfo, numa: dict[int, list[int]]) -> int:
    """How far apart two planes are: 10 per PCIe hop plus NUMA distance."""
    common = 0
    for x, y in zip(a.pci_chain, b.pci_chain, strict=False):
        if x != y:
            break
        common += 1
    hops = (len(a.pci_chain) - common) + (len(b.pci_chain) - common)
    if a.numa_node is None or b.numa_node is None:
        numa_distance = 10
    else:
        row = numa.get(a.numa_node, [])
        numa_distance = row[b.numa_node] if b.numa_node < len(row) else 20
    return 10 * hops + numa_distance


def choose(
    candidates: list[PlaneInfo], count: int, numa: dict[int, list[int]], *, pipeline: bool
) -> list[PlaneInfo] | None:
    """The tightest set of `count` planes (least summed pairwise distance);
    ties go to the set touching the fewest NUMA nodes (fragmenting least).
    For a pipeline, the set is ordered as the shortest chain. None when
    there are too few candidates."""
    if count > len(candidates):
        return None
    ordered = sorted(candidates, key=lambda p: p.id)
    best: tuple[int, int, tuple[str, ...]] | None = None
    best_set: tuple[PlaneInfo, ...] = ()
    for subset in itertools.combinations(ordered, count):
        cost = sum(distance(a, b, numa) for a, b in itertools.combinations(subset, 2))
        nodes = {p.numa_node for p in subset}
        spread = len(nodes)
        key = (cost, spread, tuple(p.id for p in subset))
        if best is None or key < best:
            best, best_set = key, subset
    if not pipeline or count < 3:
        return list(best_set)
    chains = itertools.permutations(best_set)
    return list(
        min(
            chains,
            key=lambda chain: (
                sum(distance(a, b, numa) for a, b in itertools.pairwise(chain)),
                tuple(p.id for p in chain),
            ),
        )
    )
