"""Multi-GPU gang triage, as pure functions: kernel and journal lines in,
faults and the planes to quarantine out.

Three classes are told apart, checked in this order on each line:

- `vram_exhausted`: the device ran out of memory (amdgpu's "Not enough
  memory for command submission", TTM eviction failures, CUDA/HIP/ggml
  allocation failures "out of memory"). The plane is healthy: it is not
  quarantined; the workload is too big for it.
- `interconnect`: a PCIe or peer-DMA link fault: AER uncorrected errors
  (`pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received:
  0000:01:00.0`, `PCIe Bus Error: severity=Uncorrected`), NVIDIA Xid 74
  (NVLink) and 79 (fallen off the bus). Every plane below the faulty link
  is quarantined: the named device, or every device behind a named port.
  Corrected AER errors are not faults.
- `driver_hang`: a DRM/driver hang: amdgpu ring timeouts and job timeouts,
  i915 "GPU HANG", NVIDIA Xid codes of a stuck engine or firmware (8, 32,
  56, 57, 61, 62, 69, 109, 119, 120, 154). That plane is quarantined.

A fault is tied to a device by the PCI address in the line (NVIDIA's
`PCI:0000:65:00` names a bus and slot, matched against the function). A
fault whose line names no device cannot be tied to a plane and quarantines
nothing; the verdict says so. Healthy planes keep serving.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

DRIVER_HANG = "driver_hang"
INTERCONNECT = "interconnect"
VRAM_EXHAUSTED = "vram_exhausted"

_ADDRESS = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_PCI = re.compile(rf"\b({_ADDRESS})\b")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\): (\d+)")
_XID_HANG = {8, 32, 56, 57, 61, 62, 69, 109, 119, 120, 154}
_XID_LINK = {74, 79}
_AER = re.compile(rf"({_ADDRESS}): AER: (?:Uncorrect|Multiple Uncorrect)\w*[^:]*error received:"
                  rf"\s*({_ADDRESS})?")
_BUS_ERROR = re.compile(r"PCIe Bus Error: severity=(?:Uncorrected|Fatal)")
_VRAM = re.compile(
    r"(Not enough memory for command submission|\[TTM\] Buffer eviction failed|"
    r"(?:CUDA|HIP|cuda|hip)(?: error)?:? out of memory|CUDA out of memory|"
    r"hipErrorOutOfMemory|cudaErrorMemoryAllocation|cudaMalloc failed: out of memory|"
    r"failed to allocate \S+ (?:buffer|VRAM)|VRAM (?:exhausted|full))")
#: contextd's summary prefixes of kernel events.
_PREFIX = re.compile(r"^kernel: (?:GPU error: )?")
_HANG = re.compile(
    r"(ring \S+ timeout|amdgpu_job_timedout|GPU HANG|GPU hang|"
    r"Resetting \w+ for (?:hang|preemption time out)|\*ERROR\* \S* ?hang)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """One classified line."""

    kind: str
    #: The PCI address (or NVIDIA's bus:slot) the line names, if any.
    device: str | None
    #: Whether `device` is a port whose downstream devices are all affected.
    port: bool = False
    line: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Plane:
    """A compute plane as gang triage sees it: its id and its PCI chain
    (root port first, the device last; empty for the CPU)."""

    id: str
    chain: tuple[str, ...] = ()


@dataclass(slots=True, kw_only=True)
class Verdict:
    faults: list[Fault] = field(default_factory=list)
    #: plane id → why it is quarantined.
    quarantine: dict[str, str] = field(default_factory=dict)
    #: Planes that keep serving.
    healthy: list[str] = field(default_factory=list)
    #: Faults that name no known plane, in words.
    unplaced: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if not self.faults:
            return "no GPU, interconnect or VRAM fault in the context"
        kinds = sorted({f.kind for f in self.faults})
        parts = [f"faults: {', '.join(kinds)}"]
        if self.healthy:
            parts.append(f"serving: {', '.join(self.healthy)}")
        if self.quarantine:
            parts.append("quarantine " + "; ".join(
                f"{plane} ({why})" for plane, why in sorted(self.quarantine.items())))
        else:
            parts.append("no plane quarantined")
        if self.unplaced:
            parts.append("; ".join(self.unplaced))
        return "; ".join(parts)


def classify_line(line: str) -> Fault | None:
    """The gang class of one kernel or journal line, or None."""
    text = line.strip()
    address = _PCI.search(text)
    device = address.group(1).lower() if address else None
    if _VRAM.search(text):
        return Fault(kind=VRAM_EXHAUSTED, device=device, line=text)
    if match := _XID.search(text):
        bus, code = match.group(1).lower(), int(match.group(2))
        if code in _XID_LINK:
            return Fault(kind=INTERCONNECT, device=bus, line=text)
        if code in _XID_HANG:
            return Fault(kind=DRIVER_HANG, device=bus, line=text)
        return None
    if match := _AER.search(text):
        port, source = match.group(1).lower(), match.group(2)
        if source is not None and source.lower() != port:
            return Fault(kind=INTERCONNECT, device=source.lower(), line=text)
        return Fault(kind=INTERCONNECT, device=port, port=True, line=text)
    if _BUS_ERROR.search(text):
        return Fault(kind=INTERCONNECT, device=device, line=text)
    if _HANG.search(text):
        return Fault(kind=DRIVER_HANG, device=device, line=text)
    return None


def classify(lines: Iterable[str]) -> list[Fault]:
    """Every fault in the lines, in order, each (kind, device, line) once."""
    seen: set[tuple[str, str | None, str]] = set()
    faults: list[Fault] = []
    for line in lines:
        fault = classify_line(line)
        if fault is not None and (fault.kind, fault.device, fault.line) not in seen:
            seen.add((fault.kind, fault.device, fault.line))
            faults.append(fault)
    return faults


def _matches(device: str, address: str) -> bool:
    """`device` is the address, or NVIDIA's bus:slot of it."""
    return address == device or (device.count(".") == 0 and address.startswith(device + "."))


def affected(fault: Fault, planes: list[Plane]) -> list[str]:
    """The planes a fault takes down."""
    if fault.device is None or fault.kind == VRAM_EXHAUSTED:
        return []
    hit = []
    for plane in planes:
        if not plane.chain:
            continue
        if _matches(fault.device, plane.chain[-1]) or (
                fault.kind == INTERCONNECT and any(_matches(fault.device, a)
                                                   for a in plane.chain[:-1])):
            hit.append(plane.id)
    return hit


def _reason(fault: Fault) -> str:
    what = {DRIVER_HANG: "driver hang", INTERCONNECT: "interconnect fault",
            VRAM_EXHAUSTED: "VRAM exhausted"}[fault.kind]
    where = f" at {fault.device}" if fault.device else ""
    line = _PREFIX.sub("", fault.line)
    line = line if len(line) <= 100 else line[:99] + "…"
    return f"{what}{where}: {line}"


def judge(faults: list[Fault], planes: list[Plane]) -> Verdict:
    """Which planes to quarantine, and why; the others keep serving."""
    verdict = Verdict(faults=faults)
    for fault in faults:
        if fault.kind == VRAM_EXHAUSTED:
            where = f" on {fault.device}" if fault.device else ""
            verdict.unplaced.append(f"VRAM exhausted{where}: the plane is healthy, "
                                    "not quarantined")
            continue
        hit = affected(fault, planes)
        if not hit:
            verdict.unplaced.append(
                f"{fault.kind} names no known plane"
                f"{' (' + fault.device + ')' if fault.device else ''}: nothing quarantined")
        for plane in hit:
            verdict.quarantine.setdefault(plane, _reason(fault))
    verdict.healthy = [p.id for p in planes if p.id not in verdict.quarantine]
    verdict.unplaced = list(dict.fromkeys(verdict.unplaced))
    return verdict
