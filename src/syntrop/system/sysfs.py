"""Reading compute devices from sysfs and procfs.

Every reader takes the root of the tree (normally "/"), so tests build fake
trees: /sys/class/drm/renderD*, /sys/class/accel/accel*, the PCI devices they
point to (vendor, device, numa_node, driver link, amdgpu's mem_info_vram_*),
/sys/devices/system/node/node*/distance, /proc/cpuinfo and /proc/meminfo.
Parsers are pure functions of text.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

VENDORS = {
    "0x10de": "NVIDIA",
    "0x1002": "AMD",
    "0x8086": "Intel",
    "0x1af4": "Virtio",
    "0x1ae0": "Google",
}

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True, slots=True, kw_only=True)
class PciDevice:
    address: str  # 0000:01:00.0
    path: Path  # resolved sysfs directory of the device
    vendor: str
    device: str
    driver: str | None
    numa_node: int | None
    #: PCI addresses from the root complex down to the device, the device last.
    chain: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """A DRM render node or an accel (NPU) device."""

    id: str  # drm-renderD128, accel-accel0
    node: str  # renderD128, accel0
    kind: str  # drm_gpu, npu
    pci: PciDevice | None
    vram_total: int | None
    vram_used: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuInfo:
    model: str
    cores: int
    flags: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemInfo:
    total: int
    available: int


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def pci_device(path: Path) -> PciDevice | None:
    """The PCI device a sysfs `device` link points to, if it is one."""
    try:
        resolved = path.resolve(strict=True)
    except OSError:
        return None
    if not _PCI_ADDRESS.match(resolved.name):
        return None
    chain = tuple(part for part in resolved.parts if _PCI_ADDRESS.match(part))
    driver_link = resolved / "driver"
    driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
    numa = _int(_read(resolved / "numa_node"))
    return PciDevice(
        address=resolved.name,
        path=resolved,
        vendor=_read(resolved / "vendor") or "",
        device=_read(resolved / "device") or "",
        driver=driver,
        numa_node=numa if numa is not None and numa >= 0 else None,
        chain=chain,
    )


def accelerators(root: Path = Path("/")) -> list[Accelerator]:
    """DRM render nodes and accel devices, sorted by id."""
    found: list[Accelerator] = []
    for klass, prefix, kind in (("drm", "renderD", "drm_gpu"), ("accel", "accel", "npu")):
        directory = root / "sys" / "class" / klass
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if not name.startswith(prefix) or not name[len(prefix):].isdigit():
                continue
            pci = pci_device(directory / name / "device")
            vram_total = vram_used = None
            if pci is not None:
                vram_total = _int(_read(pci.path / "mem_info_vram_total"))
                vram_used = _int(_read(pci.path / "mem_info_vram_used"))
            found.append(
                Accelerator(
                    id=f"{klass}-{name}", node=name, kind=kind, pci=pci,
                    vram_total=vram_total, vram_used=vram_used,
                )
            )
    return found


def nvidia_minors(root: Path = Path("/")) -> list[int]:
    """The NVIDIA driver's GPU device nodes (/dev/nvidia0, /dev/nvidia1, …),
    which exist where no DRM render node does (virtual machines, hosts
    without nvidia-drm), by minor number."""
    try:
        names = os.listdir(root / "dev")
    except OSError:
        return []
    return sorted(int(name[6:]) for name in names
                  if name.startswith("nvidia") and name[6:].isdigit())


def pci_address(bus_id: str) -> str:
    """sysfs's spelling of a PCI bus id as NVIDIA's tools write it
    (00000000:65:00.0 → 0000:65:00.0); ValueError for anything else."""
    domain, bus, slot = bus_id.strip().lower().split(":")
    address = f"{int(domain, 16):04x}:{bus}:{slot}"
    if not _PCI_ADDRESS.match(address):
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return address


def parse_cpuinfo(text: str) -> CpuInfo:
    model = ""
    processors = 0
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            processors += 1
        elif key == "model name" and not model:
            model = value
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model=model or "CPU", cores=processors or 1, flags=flags)


def parse_meminfo(text: str) -> MemInfo:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    total = values.get("MemTotal", 0)
    return MemInfo(total=total, available=values.get("MemAvailable", values.get("MemFree", 0)))


def cpu(root: Path = Path("/")) -> CpuInfo:
    return parse_cpuinfo(_read(root / "proc" / "cpuinfo") or "")


def memory(root: Path = Path("/")) -> MemInfo:
    return parse_meminfo(_read(root / "proc" / "meminfo") or "")


def numa_distances(root: Path = Path("/")) -> dict[int, list[int]]:
    """node -> distances to every node, from /sys/devices/system/node."""
    directory = root / "sys" / "devices" / "system" / "node"
    distances: dict[int, list[int]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return distances
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            text = _read(directory / name / "distance")
            if text:
                distances[int(name[4:])] = [int(x) for x in text.split()]
    return distances


VECTOR_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def vector_extensions(info: CpuInfo) -> list[str]:
    return [flag for flag in VECTOR_EXTENSIONS if flag in info.flags]
