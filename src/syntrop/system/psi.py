"""Pressure stall information: /proc/pressure/{cpu,memory,io}.

Parsing is a pure function of the file's text. Triggers (psi.rst): writing
"some <stall us> <window us>" to a pressure file arms it, and the kernel
signals POLLPRI when the stall threshold is crossed within the window. Only
windows of 2 s or more are accepted without CAP_SYS_RESOURCE. asyncio cannot
wait for POLLPRI, so each trigger lives in a private epoll set whose own fd
(readable when the trigger fires) is what the event loop watches.
"""

import os
import select
from dataclasses import dataclass
from pathlib import Path

RESOURCES = ("cpu", "memory", "io")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pressure:
    """One line of a pressure file: percentages of time stalled."""

    avg10: float
    avg60: float
    avg300: float
    total_usec: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    some: Pressure
    full: Pressure | None


class PsiFormatError(ValueError):
    """The text is not in the pressure file format."""


def parse(text: str) -> Reading:
    """Parse the contents of a /proc/pressure/* file."""
    lines: dict[str, Pressure] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, _, rest = line.partition(" ")
        try:
            values = dict(field.split("=", 1) for field in rest.split())
            lines[kind] = Pressure(
                avg10=float(values["avg10"]),
                avg60=float(values["avg60"]),
                avg300=float(values["avg300"]),
                total_usec=int(values["total"]),
            )
        except (KeyError, ValueError) as error:
            raise PsiFormatError(f"bad pressure line {line!r}") from error
    if "some" not in lines:
        raise PsiFormatError("no 'some' line")
    return Reading(some=lines["some"], full=lines.get("full"))


def read(resource: str, *, root: Path = Path("/proc")) -> Reading | None:
    """Read one resource's pressure; None where the kernel has no PSI."""
    try:
        return parse((root / "pressure" / resource).read_text())
    except (OSError, PsiFormatError):
        return None


class Trigger:
    """A PSI trigger: `fileno()` becomes readable when it fires; call
    `consume()` then."""

    def __init__(
        self, resource: str, *, stall_usec: int, window_usec: int, root: Path = Path("/proc")
    ) -> None:
        self._fd = os.open(root / "pressure" / resource, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.write(self._fd, f"some {stall_usec} {window_usec}\0".encode())
            self._epoll = select.epoll()
            self._epoll.register(self._fd, select.EPOLLPRI)
        except BaseException:
            os.close(self._fd)
            raise

    def fileno(self) -> int:
        return self._epoll.fileno()

    def consume(self) -> bool:
        """True when the trigger fired (POLLPRI), False on a spurious wake."""
        events = self._epoll.poll(0)
        return any(mask & select.EPOLLPRI for _, mask in events)

    def close(self) -> None:
        self._epoll.close()
        os.close(self._fd)
