"""Pressure (PSI) as inferenced reads it: avg10 of cpu, memory and io, the
level they make against the configured thresholds, and a trigger that hears
memory pressure as it starts."""

import asyncio
import logging
import time
from pathlib import Path

from syntrop.system import psi

logger = logging.getLogger(__name__)

LEVELS = ("normal", "elevated", "critical")
#: Priorities refused at each pressure level.
REFUSED = {"elevated": {"Batch"}, "critical": {"Batch", "Interactive"}}
PSI_CACHE = 0.5


class Pressure:
    """The pressure of the host under `root`, read on demand and cached."""

    def __init__(self, root: Path, thresholds: dict[str, tuple[float, float]]) -> None:
        self.root = root
        self.thresholds = thresholds
        self.trigger: psi.Trigger | None = None
        self._cache: tuple[float, dict[str, float]] | None = None

    def arm_trigger(self) -> None:
        """Hear about memory pressure as it starts (a PSI trigger: 100 ms of
        stall within 2 s), not only when a request reads avg10."""
        self.trigger = None
        if self.root != Path("/"):
            return  # a test tree: its pressure files are plain files
        try:
            self.trigger = psi.Trigger(
                "memory", stall_usec=100_000, window_usec=2_000_000, root=self.root / "proc"
            )
        except OSError as error:
            logger.info("no PSI trigger (%s); pressure is read per request", error)
            self.trigger = None
            return
        asyncio.get_running_loop().add_reader(self.trigger.fileno(), self._event)

    def _event(self) -> None:
        if self.trigger is None or not self.trigger.consume():
            return
        self._cache = None
        level, resource = self.level()
        logger.warning("%s pressure: level %s; Batch%s refused while it lasts",
                       resource, level, " and Interactive" if level == "critical" else "")

    def readings(self) -> dict[str, float]:
        """avg10 of each resource. The kernel recomputes avg10 every 2 s, so
        a reading younger than PSI_CACHE seconds is reused."""
        now = time.monotonic()
        if self._cache is not None and now - self._cache[0] < PSI_CACHE:
            return self._cache[1]
        values = {}
        for resource in psi.RESOURCES:
            reading = psi.read(resource, root=self.root / "proc")
            values[resource] = reading.some.avg10 if reading else 0.0
        self._cache = (now, values)
        return values

    def level(self) -> tuple[str, str]:
        """The worst level over the resources, and the resource causing it."""
        worst, cause = 0, "memory"
        for resource, value in self.readings().items():
            if resource not in self.thresholds:
                continue
            elevated, critical = self.thresholds[resource]
            level = 2 if value >= critical else 1 if value >= elevated else 0
            if level > worst:
                worst, cause = level, resource
        return LEVELS[worst], cause

    def refuses(self, priority: str) -> tuple[str, str] | None:
        """(level, resource) when the pressure now refuses `priority`."""
        level, resource = self.level()
        return (level, resource) if priority in REFUSED.get(level, set()) else None

    def close(self) -> None:
        if self.trigger is not None:
            asyncio.get_running_loop().remove_reader(self.trigger.fileno())
            self.trigger.close()
