"""What tools get to do their work: config, systemd, the sandbox, history.

One `Context` per daemon; tools receive it with each call. The D-Bus
connection is opened on first use and kept; a failed call drops it so the
next action reconnects. Sandbox availability is probed once, on first use.
"""

import logging
import time
from collections.abc import Callable
from typing import Any

from syntrop.system import sandbox
from syntrop.system.systemd import NotConnected, Systemd, SystemdError, UnitState
from syntrop.toold import errors
from syntrop.toold.audit import Audit
from syntrop.toold.config import Config
from syntrop.toold.dropins import Change

logger = logging.getLogger(__name__)

HELPER = "syntrop.toold.helper"
LAYERS = ("bubblewrap", "landlock", "seccomp")


def now_usec() -> int:
    return time.time_ns() // 1000


class Context:
    def __init__(self, config: Config, audit: Audit) -> None:
        self.config = config
        self.audit = audit
        self._systemd: Systemd | None = None
        self._availability: sandbox.Availability | None = None
        self.action_id = 0

    # systemd -----------------------------------------------------------------

    async def systemd(self) -> Systemd:
        """The connection to PID 1; raises NoSystemd."""
        if self._systemd is None:
            try:
                self._systemd = await Systemd.open(self.config.dbus_address)
            except SystemdError as error:
                raise errors.NoSystemd(str(error), reason=str(error)) from None
        return self._systemd

    def drop_systemd(self) -> None:
        if self._systemd is not None:
            self._systemd.close()
            self._systemd = None

    async def unit_state(self, unit: str) -> UnitState:
        """The unit's state; raises NotFound when systemd does not know it."""
        systemd = await self.systemd()
        try:
            state = await systemd.unit_state(unit)
        except NotConnected as error:
            self.drop_systemd()
            raise errors.NoSystemd(str(error), reason=str(error)) from None
        except SystemdError as error:
            if error.name.endswith(("NoSuchUnit", "InvalidArgs")):
                raise errors.NotFound(str(error), unit=unit) from None
            self.drop_systemd()
            raise errors.NoSystemd(str(error), reason=str(error)) from None
        if state.load_state in ("not-found", ""):
            raise errors.NotFound(f"{unit}: LoadState={state.load_state}", unit=unit)
        return state

    def close(self) -> None:
        self.drop_systemd()

    # sandbox -----------------------------------------------------------------

    def availability(self) -> sandbox.Availability:
        if self._availability is None:
            self._availability = sandbox.available(self.config.bwrap)
            if self._availability.reasons:
                logger.warning("sandbox layers missing: %s", self._availability.reasons)
        return self._availability

    def layers(self) -> sandbox.Layers:
        """The layers tool processes get; raises NoSandbox when one is
        missing and config does not allow a weaker sandbox."""
        found = self.availability()
        offered = {"bubblewrap": found.bubblewrap, "landlock": found.landlock,
                   "seccomp": found.seccomp}
        for layer in LAYERS:
            if not offered[layer] and not self.config.allow_weaker:
                reason = found.reasons.get(layer, "unavailable")
                raise errors.NoSandbox(f"{layer}: {reason}", layer=layer, reason=reason)
        return sandbox.Layers(**offered)

    async def tool_process(self, request: dict[str, Any], writable: list[str]
                           ) -> tuple[dict[str, Any], list[str]]:
        """Run the helper confined; (its reply, the layers that applied).
        Raises sandbox.SandboxError when it could not run."""
        layers = self.layers()
        reply = await sandbox.run(HELPER, request, writable=writable, layers=layers,
                                  bwrap=self.config.bwrap, python=self.config.python,
                                  timeout=self.config.sandbox_timeout)
        applied = (["bubblewrap"] if reply.get("bubblewrap") else []) + [
            str(layer) for layer in reply.get("applied") or []]
        return reply, applied

    # contextd ----------------------------------------------------------------

    async def history(self, directory: str) -> list[Change] | None:
        """contextd's drop-in events for files of `directory`, with diffs;
        None when contextd cannot be asked."""
        prefix = directory.rstrip("/") + "/"

        def name(path: str) -> str | None:
            rest = path[len(prefix):]
            return rest if path.startswith(prefix) and "/" not in rest else None

        return await self._changes("dropin", name)

    async def file_history(self, path: str) -> list[Change] | None:
        """contextd's events (any kind) for the file `path`, with diffs, each
        named by the file's base name; None when contextd cannot be asked."""
        base = path.rpartition("/")[2]
        return await self._changes(None, lambda seen: base if seen == path else None)

    async def _changes(self, kind: str | None, select: Callable[[str], str | None]
                       ) -> list[Change] | None:
        """The newest 16 events `select` names (by the name it returns)."""
        if self.config.context_socket is None:
            return None
        from syntrop.interfaces.context import Context1
        from syntrop.varlink.client import connect

        try:
            async with await connect(Context1, address=self.config.context_socket,
                                     timeout=5) as client:
                events = (await client.ListEvents(kind=kind, limit=1000))["events"]
                mine = [(e, name) for e in events
                        if (name := select(e.path or "")) is not None]
                changes = []
                for event, name in mine[-16:]:
                    full = (await client.GetEvent(id=event.id))["event"] if event.has_diff \
                        else event
                    changes.append(Change(name=name, action=event.action,
                                          timestamp_usec=event.timestamp_usec,
                                          diff=full.diff))
        except (OSError, TimeoutError) as error:
            logger.info("contextd not asked (%s); using toold's snapshots", error)
            return None
        except Exception as error:  # a Varlink error reply (an older contextd's among them)
            logger.warning("contextd answered %r; using toold's snapshots", error)
            return None
        return changes
