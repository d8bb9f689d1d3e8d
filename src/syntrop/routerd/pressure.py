"""Host pressure for offload decisions: memory PSI (avg10 of "some") read
at most once a second. The reader is injectable for tests; the kernel's
files are read by syntrop.system (psi, sysfs), as everywhere."""

import time
from collections.abc import Callable

from syntrop.system import psi

PSI_PATH = "/proc/pressure/memory"


def read_memory_some(path: str = PSI_PATH) -> float:
    """The `some avg10` percentage of memory pressure; 0 where PSI is
    missing or unreadable."""
    try:
        with open(path) as pressure:
            return psi.parse(pressure.read()).some.avg10
    except (OSError, psi.PsiFormatError):
        return 0.0


class Pressure:
    """Whether local execution should be throttled: memory PSI over
    `threshold` percent. Readings are cached for `interval` seconds."""

    def __init__(self, threshold: float, read: Callable[[], float] | None = None,
                 interval: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 path: str = PSI_PATH) -> None:
        self.threshold = threshold
        self.path = path
        self._read = read or (lambda: read_memory_some(self.path))
        self._interval, self._clock = interval, clock
        self._value = 0.0
        self._at = float("-inf")

    def memory_some(self) -> float:
        now = self._clock()
        if now - self._at >= self._interval:
            self._value, self._at = self._read(), now
        return self._value

    def high(self) -> bool:
        return self.memory_some() > self.threshold


def free_accelerator_bytes() -> int | None:
    """Free memory of the accelerators the kernel reports in sysfs (DRM
    devices with mem_info_vram_*); None where none does."""
    from syntrop.system import sysfs

    free = None
    for device in sysfs.accelerators():
        if device.vram_total is not None and device.vram_used is not None:
            free = (free or 0) + max(0, device.vram_total - device.vram_used)
    return free


def free_host_bytes() -> int | None:
    """Host memory available (MemAvailable); None when unreadable."""
    from syntrop.system import sysfs

    try:
        return sysfs.memory().available or None
    except OSError:
        return None
