"""Host pressure for offload decisions: memory PSI (avg10 of "some") read
at most once a second. The reader is injectable for tests."""

import glob
import time
from collections.abc import Callable

PSI_PATH = "/proc/pressure/memory"


def read_memory_some(path: str = PSI_PATH) -> float:
    """The `some avg10` percentage of memory pressure; 0 where PSI is
    missing or unreadable."""
    try:
        with open(path) as pressure:
            for line in pressure:
                if line.startswith("some"):
                    for field in line.split()[1:]:
                        key, _, value = field.partition("=")
                        if key == "avg10":
                            return float(value)
    except (OSError, ValueError):
        pass
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
    cards with mem_info_vram_*); None where none does."""
    free = None
    for total_path in glob.glob("/sys/class/drm/card*/device/mem_info_vram_total"):
        try:
            with open(total_path) as total, open(total_path[:-5] + "used") as used:
                free = (free or 0) + max(0, int(total.read()) - int(used.read()))
        except (OSError, ValueError):
            continue
    return free
