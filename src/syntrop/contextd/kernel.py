"""Kernel messages that matter to triage, classified. Pure: a message in,
a classification (or None) out.

Classes: oom (the OOM killer, global or in a memory cgroup), segfault (and
general protection faults, invalid opcodes), gpu (DRM errors, GPU hangs and
resets, NVIDIA Xid), pcie (PCIe Advanced Error Reporting: uncorrected and
corrected errors a port or device reports, "PCIe Bus Error" lines),
hung_task, io_error (block and filesystem errors). A pcie summary keeps the
message whole: the PCI addresses in it are what systemd-sentry's gang
triage ties the fault to a plane by.
The unit is read from the OOM report's task_memcg= (…/foo.service) when
present; the pid and process name when the message has them.
"""

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelEvent:
    action: str
    summary: str
    pid: int | None = None
    comm: str | None = None
    unit: str | None = None


_OOM_KILLED = re.compile(
    r"(?:Memory cgroup )?[Oo]ut of memory(?: \(oom_kill_allocating_task\))?: Kill(?:ed)? process "
    r"(\d+) \(([^)]*)\)")
_OOM_REPORT = re.compile(r"^oom-kill:.*?task_memcg=([^,\s]*).*?task=([^,\s]*),pid=(\d+)")
_SEGFAULT = re.compile(r"^(\S+?)\[(\d+)\]: segfault at (\S+) ip (\S+)")
_TRAP = re.compile(r"^(?:traps: )?(\S+?)\[(\d+)\] (general protection fault|trap [^:]+)")
_HUNG = re.compile(r"^INFO: task (.+?):(\d+) blocked for more than (\d+) seconds")
_XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)")
_GPU = re.compile(
    r"(\[drm(?::[^\]]*)?\] \*ERROR\*|GPU (?:hang|HANG|reset|fault)|ring \S+ timeout|"
    r"amdgpu.*(?:timeout|fault|reset)|i915.*(?:GPU HANG|reset)|nouveau.*(?:fault|error)|"
    r"fallen off the bus)")
_PCIE = re.compile(
    r"AER: (?:Multiple )?(Uncorrected|Corrected)[^:]*error received|"
    r"PCIe Bus Error: severity=(\w+)")
_IO = re.compile(
    r"(I/O error, dev (\S+)|blk_update_request: (?:I/O|critical \w+) error|"
    r"(EXT4|XFS|BTRFS|F2FS)[-\w]* ?(?:\(\S+\))?:? .*?error|Buffer I/O error on dev)")
_UNIT_IN_CGROUP = re.compile(r"/([^/]+\.(?:service|scope|slice|socket|mount|swap))$")


def _cap(text: str, length: int = 200) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"


def classify(message: str) -> KernelEvent | None:
    """The triage class of one kernel message, or None for the rest."""
    text = message.strip()
    if match := _OOM_REPORT.match(text):
        memcg, comm, pid = match.groups()
        unit = _unit_of(memcg)
        where = f" in {memcg}" if memcg and memcg != "/" else ""
        return KernelEvent(action="oom", pid=int(pid), comm=comm, unit=unit,
                           summary=_cap(f"kernel: OOM killer chose {comm} (pid {pid}){where}"))
    if match := _OOM_KILLED.search(text):
        pid, comm = match.groups()
        scope = "memory cgroup limit" if text.startswith("Memory cgroup") else "system"
        return KernelEvent(action="oom", pid=int(pid), comm=comm,
                           summary=_cap(f"kernel: OOM killed {comm} (pid {pid}), "
                                        f"{scope} out of memory"))
    if match := _SEGFAULT.match(text):
        comm, pid, address, ip = match.groups()
        library = text.partition(" in ")[2].split("[")[0].strip()
        where = f" in {library}" if library else ""
        return KernelEvent(action="segfault", pid=int(pid), comm=comm,
                           summary=_cap(f"kernel: {comm} (pid {pid}) segfault at {address} "
                                        f"ip {ip}{where}"))
    if match := _TRAP.match(text):
        comm, pid, trap = match.groups()
        return KernelEvent(action="segfault", pid=int(pid), comm=comm,
                           summary=_cap(f"kernel: {comm} (pid {pid}) {trap}"))
    if match := _HUNG.match(text):
        comm, pid, seconds = match.groups()
        return KernelEvent(action="hung_task", pid=int(pid), comm=comm,
                           summary=_cap(f"kernel: {comm} (pid {pid}) blocked for more than "
                                        f"{seconds} s"))
    if match := _XID.search(text):
        device, code = match.groups()
        pid_match = re.search(r"pid=(\d+)", text)
        pid = int(pid_match.group(1)) if pid_match else None
        return KernelEvent(action="gpu", pid=pid,
                           summary=_cap(f"kernel: NVIDIA Xid {code} on {device}: {text}"))
    if match := _PCIE.search(text):
        severity = (match.group(1) or match.group(2)).lower()
        return KernelEvent(action="pcie",
                           summary=_cap(f"kernel: PCIe {severity} error: {text}", 300))
    if _GPU.search(text):
        return KernelEvent(action="gpu", summary=_cap(f"kernel: GPU error: {text}"))
    if _IO.search(text):
        return KernelEvent(action="io_error", summary=_cap(f"kernel: I/O error: {text}"))
    return None


def _unit_of(cgroup: str) -> str | None:
    match = _UNIT_IN_CGROUP.search(cgroup)
    return match.group(1) if match else None
