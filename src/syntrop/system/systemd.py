"""systemd's Manager over D-Bus (sd-bus through sdbus), asyncio.

One object, `Systemd`, for the calls daemons make to PID 1: Reload,
RestartUnit/StartUnit/StopUnit with the job's result, a unit's state, and the
JobRemoved signal as an async iterator (sentry watches it).

Design note on jobs: systemd emits JobRemoved only after some client called
Manager.Subscribe(), and a job can finish before the method call that
queued it returns. So `run_job` subscribes once per connection, registers the
signal match *before* queuing the job (awaiting the match registration), and
buffers every JobRemoved seen from then on; the job's own signal is then
looked up by its object path. Nothing is polled.

sdbus is imported inside `Systemd.open`, so importing this module is cheap.
"""

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

DESTINATION = "org.freedesktop.systemd1"
PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
SERVICE = "org.freedesktop.systemd1.Service"
PROPERTIES = "org.freedesktop.DBus.Properties"


class SystemdError(Exception):
    """A D-Bus call to systemd failed. `name` is the D-Bus error name when
    there is one (org.freedesktop.systemd1.NoSuchUnit, ...)."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class NotConnected(SystemdError):
    """No bus could be opened (no system bus here, or a bad address)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """How a job ended: done, canceled, timeout, failed, dependency,
    skipped (systemd's JobRemoved result), or timeout_waiting when no
    JobRemoved came within our own timeout."""

    job: str
    unit: str
    result: str


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitState:
    """A unit's state as systemd shows it."""

    name: str
    load_state: str
    active_state: str
    sub_state: str
    #: The Service's Result (success, exit-code, ...); "" for other unit types.
    result: str
    #: Service restarts counted by systemd; 0 for other unit types.
    n_restarts: int
    fragment_path: str
    drop_in_paths: tuple[str, ...]


def _plain(error: BaseException) -> str:
    """sdbus's message without its C source location."""
    text = str(error)
    number = re.search(r"returned error number: (\d+)", text)
    return os.strerror(int(number.group(1))) if number else text


def _error_name(error: BaseException) -> str:
    # sdbus raises mapped exceptions (whose class names the error) or
    # SdBusUnmappedMessageError(name, message).
    name = getattr(error, "dbus_error_name", "")
    if not name and error.args and isinstance(error.args[0], str) and "." in error.args[0]:
        name = error.args[0]
    return str(name)


def open_system_bus(address: str | None = None) -> Any:
    """An sd-bus connection to the system bus, or to `address` (a D-Bus
    address). It connects lazily: the first call finds out whether anyone
    answers. Raises NotConnected."""
    try:
        import sdbus
    except ImportError as error:
        raise NotConnected(f"sdbus is not installed: {error}") from None
    previous = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS")
    try:
        if address is not None:
            os.environ["DBUS_SYSTEM_BUS_ADDRESS"] = address
        return sdbus.sd_bus_open_system()
    except Exception as error:  # sdbus raises its own OSError-like types
        raise NotConnected(f"cannot open the system bus: {_plain(error)}") from None
    finally:
        if address is not None:
            if previous is None:
                os.environ.pop("DBUS_SYSTEM_BUS_ADDRESS", None)
            else:
                os.environ["DBUS_SYSTEM_BUS_ADDRESS"] = previous


class Systemd:
    """A connection to PID 1's Manager. Use `await Systemd.open()`."""

    def __init__(self, bus: Any) -> None:
        self._bus = bus
        self._subscribed = False

    @classmethod
    async def open(cls, address: str | None = None) -> "Systemd":
        """Connect to the system bus (or `address`, a D-Bus address such as
        unix:path=/run/systemd/private). Raises NotConnected."""
        bus = open_system_bus(address)
        systemd = cls(bus)
        # sd_bus_open_system connects lazily: find out now whether anyone answers.
        await systemd._call(PATH, "org.freedesktop.DBus.Peer", "Ping", "")
        return systemd

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._bus.close()

    async def _call(self, path: str, interface: str, member: str, signature: str,
                    *args: Any) -> Any:
        try:
            message = self._bus.new_method_call_message(DESTINATION, path, interface, member)
            if signature:
                message.append_data(signature, *args)
            reply = await self._bus.call_async(message)
        except Exception as error:
            raise SystemdError(f"{interface}.{member}: {error}", _error_name(error)) from None
        return reply.get_contents() if reply is not None else None

    async def _get(self, path: str, interface: str, name: str) -> Any:
        value = await self._call(path, PROPERTIES, "Get", "ss", interface, name)
        # a variant arrives as (signature, value)
        return value[1] if isinstance(value, tuple) else value

    # Manager ---------------------------------------------------------------

    async def subscribe(self) -> None:
        """Ask PID 1 to emit job and unit signals to us (once is enough)."""
        if not self._subscribed:
            await self._call(PATH, MANAGER, "Subscribe", "")
            self._subscribed = True

    async def reload(self) -> None:
        """Manager.Reload: what `systemctl daemon-reload` does."""
        await self._call(PATH, MANAGER, "Reload", "")

    async def load_unit(self, name: str) -> str:
        """The unit's object path; loads it if needed (LoadState tells
        whether it exists)."""
        return str(await self._call(PATH, MANAGER, "LoadUnit", "s", name))

    async def unit_state(self, name: str) -> UnitState:
        path = await self.load_unit(name)
        values = await self._call(path, PROPERTIES, "GetAll", "s", UNIT)
        props = {key: value[1] for key, value in dict(values).items()}
        result, restarts = "", 0
        if name.endswith(".service"):
            with contextlib.suppress(SystemdError):
                service = dict(await self._call(path, PROPERTIES, "GetAll", "s", SERVICE))
                result = str(service.get("Result", ("s", ""))[1])
                restarts = int(service.get("NRestarts", ("u", 0))[1])
        return UnitState(
            name=name,
            load_state=str(props.get("LoadState", "")),
            active_state=str(props.get("ActiveState", "")),
            sub_state=str(props.get("SubState", "")),
            result=result,
            n_restarts=restarts,
            fragment_path=str(props.get("FragmentPath", "")),
            drop_in_paths=tuple(str(p) for p in props.get("DropInPaths", ())),
        )

    async def unit_properties(self, name: str) -> dict[str, Any]:
        """Every property of the unit's Unit interface and, for a service,
        of its Service interface (Result, ExecMainStatus, ExecStart,
        CacheDirectory, …), as plain values."""
        path = await self.load_unit(name)
        props = {key: value[1] for key, value in
                 dict(await self._call(path, PROPERTIES, "GetAll", "s", UNIT)).items()}
        if name.endswith(".service"):
            with contextlib.suppress(SystemdError):
                service = await self._call(path, PROPERTIES, "GetAll", "s", SERVICE)
                props.update({key: value[1] for key, value in dict(service).items()})
        return props

    async def unit_property(self, name: str, interface: str, prop: str) -> Any:
        """One property of a unit (e.g. Service.CacheDirectory)."""
        return await self._get(await self.load_unit(name), interface, prop)

    async def run_job(self, method: str, unit: str, *, mode: str = "replace",
                      timeout: float = 90) -> JobResult:
        """Queue StartUnit/StopUnit/RestartUnit/ReloadUnit/TryRestartUnit and
        wait for its JobRemoved; `result` is timeout_waiting when none came
        within `timeout` seconds (the job may still be running)."""
        if method not in ("StartUnit", "StopUnit", "RestartUnit", "ReloadUnit",
                          "TryRestartUnit", "ReloadOrRestartUnit"):
            raise ValueError(f"not a job method: {method}")
        return await self._job(lambda: self._call(PATH, MANAGER, method, "ss", unit, mode),
                               unit, timeout)

    async def start_transient(self, name: str, argv: list[str], *, description: str,
                              timeout: float = 90) -> JobResult:
        """Manager.StartTransientUnit: a oneshot service `name` running
        `argv` (argv[0] an absolute path; no shell), collected when it ends
        however it ended; waits for its start job, which ends when the
        program does: `done` when it exited 0, `failed` otherwise,
        timeout_waiting when no JobRemoved came within `timeout` seconds."""
        properties = [
            ("Description", ("s", description)),
            ("Type", ("s", "oneshot")),
            ("CollectMode", ("s", "inactive-or-failed")),
            ("ExecStart", ("a(sasb)", [(argv[0], argv, False)])),
        ]
        return await self._job(lambda: self._call(PATH, MANAGER, "StartTransientUnit",
                                                  "ssa(sv)a(sa(sv))", name, "fail", properties,
                                                  []), name, timeout)

    async def _job(self, queue: Callable[[], Awaitable[Any]], unit: str,
                   timeout: float) -> JobResult:
        """Queue a job with `queue()` (which returns its object path) and wait
        for its JobRemoved, matched before the call so a fast job is not
        missed; timeout_waiting when none came within `timeout` seconds."""
        await self.subscribe()
        removed: asyncio.Queue[tuple[int, str, str, str]] = asyncio.Queue()
        slot = await self._match_job_removed(removed)
        try:
            job = str(await queue())
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                left = deadline - asyncio.get_running_loop().time()
                try:
                    _, path, name, result = await asyncio.wait_for(removed.get(), max(left, 0))
                except TimeoutError:
                    return JobResult(job=job, unit=unit, result="timeout_waiting")
                if path == job:
                    return JobResult(job=job, unit=name, result=result)
        finally:
            slot.close()

    async def _match_job_removed(self, queue: asyncio.Queue[tuple[int, str, str, str]]) -> Any:
        def put(message: Any) -> None:
            contents = message.get_contents()
            queue.put_nowait((int(contents[0]), str(contents[1]), str(contents[2]),
                              str(contents[3])))

        try:
            return await self._bus.match_signal_async(DESTINATION, PATH, MANAGER, "JobRemoved",
                                                      put)
        except Exception as error:
            raise SystemdError(f"cannot watch JobRemoved: {error}", _error_name(error)) from None

    async def job_removed(self) -> AsyncIterator[JobResult]:
        """Every JobRemoved from now on, for as long as the caller iterates."""
        await self.subscribe()
        removed: asyncio.Queue[tuple[int, str, str, str]] = asyncio.Queue()
        slot = await self._match_job_removed(removed)
        try:
            while True:
                _, path, name, result = await removed.get()
                yield JobResult(job=path, unit=name, result=result)
        finally:
            slot.close()


# Unit state changes (sentry) ---------------------------------------------------

UNIT_PATH_PREFIX = PATH + "/unit/"


def unit_name_from_path(path: str) -> str | None:
    """The unit name of a unit object path (systemd escapes every byte that
    is not [A-Za-z0-9] as _XX); None for other paths."""
    if not path.startswith(UNIT_PATH_PREFIX):
        return None
    escaped = path[len(UNIT_PATH_PREFIX):]
    out = bytearray()
    i = 0
    while i < len(escaped):
        if escaped[i] == "_" and _is_hex(escaped[i + 1:i + 3]):
            out.append(int(escaped[i + 1:i + 3], 16))
            i += 3
        else:
            out += escaped[i].encode()
            i += 1
    return out.decode(errors="replace")


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


async def watch_units(systemd: Systemd, on_job: Any, on_state: Any) -> list[Any]:
    """Subscribe and call on_job(JobResult) for every JobRemoved and
    on_state(unit, active_state) for every Unit ActiveState change, from
    the bus callback (so they must not block). Returns the match slots; close
    them to stop. The matches are registered before Subscribe, so nothing
    emitted after this returns is missed."""

    def job(message: Any) -> None:
        contents = message.get_contents()
        on_job(JobResult(job=str(contents[1]), unit=str(contents[2]), result=str(contents[3])))

    def changed(message: Any) -> None:
        contents = message.get_contents()
        if len(contents) < 2 or contents[0] != UNIT:
            return
        value = contents[1].get("ActiveState")
        if value is None:
            return
        state = value[1] if isinstance(value, tuple) else value
        unit = unit_name_from_path(str(message.path))
        if unit is not None:
            on_state(unit, str(state))

    bus = systemd._bus
    try:
        slots = [
            await bus.match_signal_async(DESTINATION, PATH, MANAGER, "JobRemoved", job),
            await bus.match_signal_async(DESTINATION, None, PROPERTIES, "PropertiesChanged",
                                         changed),
        ]
    except Exception as error:
        raise SystemdError(f"cannot watch units: {error}", _error_name(error)) from None
    await systemd.subscribe()
    return slots
