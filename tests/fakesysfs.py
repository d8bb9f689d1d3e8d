"""Fake /sys and /proc trees shaped like real hosts, for topology tests.

Real sysfs: /sys/class/drm/renderD128 -> ../../devices/pci0000:00/.../0000:03:00.0/drm/renderD128,
whose `device` link points back at the PCI device directory holding vendor,
device, numa_node, the driver link, and (amdgpu) mem_info_vram_*.
"""

import os
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30

CPUINFO = """processor\t: 0
model name\t: Test CPU 9000
flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni
processor\t: 1
model name\t: Test CPU 9000
flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni
"""


@dataclass(frozen=True, slots=True)
class Gpu:
    node: str  # renderD128 or accel0
    pci_path: str  # "pci0000:00/0000:00:01.0/0000:01:00.0"
    vendor: str
    device: str
    driver: str
    numa: int = -1
    vram_total: int | None = None
    vram_used: int | None = None


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def build(root: Path, gpus: list[Gpu], *, ram: int = 64 * GiB, numa: list[str] | None = None,
          pressure: dict[str, float] | None = None) -> Path:
    sys_ = root / "sys"
    for gpu in gpus:
        device = sys_ / "devices" / gpu.pci_path
        write(device / "vendor", gpu.vendor + "\n")
        write(device / "device", gpu.device + "\n")
        write(device / "numa_node", f"{gpu.numa}\n")
        driver = sys_ / "bus" / "pci" / "drivers" / gpu.driver
        driver.mkdir(parents=True, exist_ok=True)
        if not (device / "driver").exists():
            os.symlink(os.path.relpath(driver, device), device / "driver")
        if gpu.vram_total is not None:
            write(device / "mem_info_vram_total", f"{gpu.vram_total}\n")
            write(device / "mem_info_vram_used", f"{gpu.vram_used or 0}\n")
        klass = "accel" if gpu.node.startswith("accel") else "drm"
        node_dir = device / klass / gpu.node
        node_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(device, node_dir), node_dir / "device")
        class_dir = sys_ / "class" / klass
        class_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(node_dir, class_dir), class_dir / gpu.node)
    for index, row in enumerate(numa or []):
        write(sys_ / "devices" / "system" / "node" / f"node{index}" / "distance", row + "\n")
    proc = root / "proc"
    write(proc / "cpuinfo", CPUINFO)
    kib = ram // 1024
    write(proc / "meminfo", f"MemTotal: {kib} kB\nMemFree: {kib // 2} kB\nMemAvailable: "
                            f"{kib * 3 // 4} kB\n")
    for resource in ("cpu", "memory", "io"):
        some = (pressure or {}).get(resource, 0.0)
        write(proc / "pressure" / resource,
              f"some avg10={some:.2f} avg60=0.00 avg300=0.00 total=0\n"
              "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    return root


#: What nvidia-smi prints for the VM below: index, name, bus id, MiB total, MiB used.
NVIDIA_SMI = ("0, NVIDIA H100 80GB HBM3, 00000000:65:00.0, 81559, 1\n"
              "1, NVIDIA H100 80GB HBM3, 00000000:E4:00.0, 81559, 40000\n")


def nvidia_vm(root: Path, smi: str | None = NVIDIA_SMI) -> Path:
    """A virtual machine with two NVIDIA GPUs and no DRM render node: the
    driver's /dev/nvidia0 and /dev/nvidia1 (plain files here), the PCI
    devices in sysfs (NUMA 0 and 1), and an nvidia-smi that prints `smi`
    (None: no nvidia-smi at all)."""
    build(root, [])
    for address, numa in (("0000:65:00.0", 0), ("0000:e4:00.0", 1)):
        device = root / "sys" / "devices" / "pci0000:00" / address
        write(device / "vendor", "0x10de\n")
        write(device / "device", "0x2330\n")
        write(device / "numa_node", f"{numa}\n")
        link = root / "sys" / "bus" / "pci" / "devices" / address
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(device, link.parent), link)
    for node in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        write(root / "dev" / node, "")
    if smi is not None:
        program = root / "usr" / "bin" / "nvidia-smi"
        write(program, "#!/bin/sh\ncat <<'EOF'\n" + smi + "EOF\n")
        program.chmod(0o755)
    return root


def nvidia_box(root: Path) -> Path:
    return build(root, [Gpu("renderD128", "pci0000:00/0000:00:01.0/0000:01:00.0",
                            "0x10de", "0x2684", "nvidia", numa=0)])


def amd_box(root: Path) -> Path:
    return build(root, [Gpu("renderD128", "pci0000:00/0000:00:03.1/0000:0b:00.0",
                            "0x1002", "0x744c", "amdgpu", numa=0,
                            vram_total=24 * GiB, vram_used=2 * GiB)])


def npu_box(root: Path) -> Path:
    return build(root, [Gpu("accel0", "pci0000:00/0000:00:0b.0", "0x8086", "0x7d1d",
                            "intel_vpu", numa=0)])


def four_gpu_box(root: Path) -> Path:
    """4 GPUs, 2 behind each PCIe switch, one switch per NUMA node."""
    gpus = []
    for numa, (rc, port, up, down_base, gpu_base) in enumerate(
        [("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02", "0000:0"),
         ("pci0000:80", "0000:80:01.0", "0000:81:00.0", "0000:82", "0000:8")]
    ):
        for slot in range(2):
            down = f"{down_base}:0{slot}.0"
            gpu = f"{gpu_base}{3 + slot}:00.0"
            gpus.append(Gpu(f"renderD{128 + numa * 2 + slot}", f"{rc}/{port}/{up}/{down}/{gpu}",
                            "0x1002", "0x740f", "amdgpu", numa=numa,
                            vram_total=64 * GiB, vram_used=0))
    return build(root, gpus, numa=["10 21", "21 10"])
