"""polkit's Authority over the system bus (sd-bus through sdbus): may this
process perform that action?

systemd's own daemons (hostnamed, machined, resolved) ask the same question
the same way: CheckAuthorization with the caller as a `unix-process`
subject — its pid, its start time (so a recycled pid is not mistaken for
it) and its uid (polkit refuses the check when they disagree) — and no
interaction: a Varlink call cannot pop up a password prompt, so an action
whose policy says auth_admin is simply not authorized for a non-root
caller without a rule granting it.

Nothing is imported or connected until the first check; one bus per
process is kept after that. No polkit on the bus is `PolkitUnavailable`,
which callers treat as a refusal, never as permission.
"""

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

AUTHORITY = "org.freedesktop.PolicyKit1"
PATH = "/org/freedesktop/PolicyKit1/Authority"
INTERFACE = "org.freedesktop.PolicyKit1.Authority"
#: CheckAuthorization flags: 0, no AllowUserInteraction.
NO_INTERACTION = 0


class PolkitUnavailable(Exception):
    """No system bus, or nobody owns org.freedesktop.PolicyKit1 on it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Subject:
    """The process asking: pid, start time (field 22 of /proc/PID/stat, in
    clock ticks since boot, as polkit reads it; 0: polkit looks it up) and
    uid (polkit refuses the check when the process has another)."""

    pid: int
    start_time: int
    uid: int


class Authority:
    """A connection to polkit, opened at the first check."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._bus: Any = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> Any:
        async with self._lock:
            if self._bus is None:
                from syntrop.system.systemd import NotConnected, open_system_bus

                try:
                    self._bus = open_system_bus(self.address)
                except NotConnected as error:
                    raise PolkitUnavailable(str(error)) from None
            return self._bus

    async def check(self, action: str, subject: Subject,
                    details: dict[str, str] | None = None) -> bool:
        """Whether polkit authorizes `subject` for `action` now, without
        asking anyone. Raises PolkitUnavailable when it cannot be asked."""
        bus = await self._connect()
        try:
            message = bus.new_method_call_message(AUTHORITY, PATH, INTERFACE,
                                                  "CheckAuthorization")
            message.append_data("(sa{sv})", ("unix-process", {
                "pid": ("u", subject.pid), "start-time": ("t", subject.start_time),
                "uid": ("i", subject.uid)}))
            message.append_data("sa{ss}us", action, details or {}, NO_INTERACTION, "")
            reply = await bus.call_async(message)
        except Exception as error:
            self.close()  # a bus that failed once is opened afresh next time
            raise PolkitUnavailable(f"CheckAuthorization({action}): {error}") from None
        # The reply is one struct (bba{ss}): is_authorized, is_challenge, details.
        result = reply.get_contents()
        if len(result) == 1:
            result = result[0]
        return bool(result[0])

    def close(self) -> None:
        if self._bus is not None:
            with contextlib.suppress(Exception):
                self._bus.close()
            self._bus = None
