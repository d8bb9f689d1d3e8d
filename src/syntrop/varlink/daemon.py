"""Start-up shared by the seven daemons: activation or bind, limits, notify,
watchdog, idle exit, signals. A daemon's __main__ is one call to `run()`."""

import asyncio
import inspect
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asyncvarlink import VarlinkInterface

from syntrop.config import ConfigError, Paths
from syntrop.system import logging as syslog
from syntrop.system.notify import notify, watchdog_interval
from syntrop.varlink.activation import listen_fds
from syntrop.varlink.server import Limits, Server, bind_unix, raise_fd_limit

logger = logging.getLogger(__name__)

#: Seconds an activated daemon waits with nothing to do before it exits.
DEFAULT_IDLE_TIMEOUT = 30.0

ServiceFactory = Callable[[Paths], VarlinkInterface | Awaitable[VarlinkInterface]]


def _idle_timeout(program: str, argv: list[str] | None) -> float | None:
    """--idle-timeout SECONDS, the one option. The units pass none: then
    argparse (and gettext under it, ~4 ms of every cold start) is not
    imported at all."""
    if not (sys.argv[1:] if argv is None else argv):
        return None
    import argparse

    parser = argparse.ArgumentParser(prog=program)
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exit after this long without clients (0: never; default: "
        f"{DEFAULT_IDLE_TIMEOUT:.0f} when socket-activated, never otherwise; "
        "also $SYNTROP_IDLE_TIMEOUT)",
    )
    timeout: float | None = parser.parse_args(argv).idle_timeout
    return timeout


def run(
    program: str,
    interface: str,
    factory: ServiceFactory,
    *,
    argv: list[str] | None = None,
    keep_alive: Callable[[], bool] | None = None,
) -> None:
    """Serve `interface` until idle or told to stop. Exits the process."""
    idle_timeout = _idle_timeout(program, argv)
    syslog.setup(program)
    try:
        asyncio.run(_serve(program, interface, factory, idle_timeout, keep_alive))
    except KeyboardInterrupt:
        pass
    except ConfigError as error:  # it names the file, key and what was expected
        logger.error("cannot serve %s: %s", interface, error)
        sys.exit(1)
    except OSError as error:
        logger.error("cannot serve %s: %s", interface, error)
        sys.exit(1)


async def _serve(
    program: str,
    interface: str,
    factory: ServiceFactory,
    idle_timeout: float | None,
    keep_alive: Callable[[], bool] | None,
) -> None:
    raise_fd_limit()
    paths = Paths.from_environment()
    inherited = listen_fds()
    if idle_timeout is None:
        idle_timeout = _from_environment("SYNTROP_IDLE_TIMEOUT", float)
    if idle_timeout is None:
        idle_timeout = DEFAULT_IDLE_TIMEOUT if inherited else 0
    made: Any = factory(paths)
    service: VarlinkInterface = await made if inspect.isawaitable(made) else made
    server = Server(
        [service],
        limits=_limits(idle_timeout),
        product=program,
        # A service with work that outlives connections (leases to watch,
        # models kept warm) says so through its own keep_alive().
        keep_alive=_answering(keep_alive or getattr(service, "keep_alive", None)),
    )
    if inherited:
        for sock in inherited.sockets:
            server.add_listener(sock)
        for sock in inherited.connected:
            server.add_connection(sock)
        where = "activated socket"
    else:
        path = paths.socket(interface)
        server.add_listener(bind_unix(path))
        where = str(path)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stop)
    watchdog = None
    interval = watchdog_interval()
    if interval:
        watchdog = asyncio.create_task(_watchdog(interval))
    notify("READY=1", f"STATUS=Serving {interface} on {where}")
    logger.debug("serving %s on %s", interface, where)
    try:
        await server.stopped.wait()
    finally:
        notify("STOPPING=1")
        if watchdog is not None:
            watchdog.cancel()
        await server.close()
        closer = getattr(service, "aclose", None)
        if closer is not None:
            await closer()


def _answering(keep_alive: Callable[[], bool] | None) -> Callable[[], bool] | None:
    """`keep_alive`, answering no when it fails: the idle exit it is asked
    from is re-armed by its answer, so a raise would keep the daemon up
    until the next connection."""
    if keep_alive is None:
        return None

    def answer() -> bool:
        try:
            return bool(keep_alive())
        except Exception:
            logger.exception("keep_alive failed, exiting on idle")
            return False

    return answer


_Number = TypeVar("_Number", int, float)


def _from_environment(variable: str, kind: type[_Number]) -> _Number | None:
    """A non-negative number from the environment; None when unset or bad."""
    value = os.environ.get(variable, "").strip()
    if not value:
        return None
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not number >= 0 or number == float("inf"):
        logger.warning("$%s=%r is not a non-negative number, ignoring", variable, value)
        return None
    return number


def _limits(idle_timeout: float) -> Limits:
    """The server's limits: sd-varlink's defaults, the connection caps
    overridable by $SYNTROP_MAX_CONNECTIONS and
    $SYNTROP_MAX_CONNECTIONS_PER_UID (tests and small hosts)."""
    defaults = Limits()
    total = _from_environment("SYNTROP_MAX_CONNECTIONS", int)
    per_uid = _from_environment("SYNTROP_MAX_CONNECTIONS_PER_UID", int)
    return Limits(
        max_connections=defaults.max_connections if total is None else total,
        max_connections_per_uid=defaults.max_connections_per_uid if per_uid is None else per_uid,
        idle_timeout=idle_timeout or None,
    )


async def _watchdog(interval: float) -> None:
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
