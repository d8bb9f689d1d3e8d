"""The dev launcher behind `syn up`: socket activation without systemd as PID 1.

It does for the seven daemons what systemd does with Accept=no .socket units:
bind every socket first, then spawn a daemon on the first connection to its
socket, handing it the listening socket as fd 3 with LISTEN_FDS=1,
LISTEN_FDNAMES=varlink and LISTEN_PID set to the daemon's own pid. While the
daemon runs, the launcher ignores that socket; when the daemon exits (idle,
crash), the launcher watches it again, so the next connection starts it anew.

routerd's HTTP ingress is held the same way, as routerd.socket holds it under
systemd: the launcher binds routerd.toml's `http.listen` addresses (default
127.0.0.1:32768 and [::1]:32768) and passes them after the Varlink socket,
named "http", so an OpenAI client reaches routerd at once and routerd may
still exit when idle.

Layout of a launcher directory DIR:

    DIR/run/io.syntrop.<Name>1   the sockets (RUNTIME_DIRECTORY)
    DIR/state/<daemon>/          STATE_DIRECTORY of each daemon
    DIR/cache/<daemon>/          CACHE_DIRECTORY
    DIR/config/                  CONFIGURATION_DIRECTORY (shared)
    DIR/log/<daemon>.log         the daemon's stderr
    DIR/launcher.pid             the launcher's pid
    DIR/status.json              per daemon: pid, starts, last exit status;
                                 routerd's HTTP addresses and bind failures

As root on a cgroup v2 host, runtimed gets a cgroup of its own below the
launcher's (syntrop-dev-PID-runtimed), which it is told is delegated to it
(SYNTROP_DELEGATED=1, as runtimed.service's Delegate=yes does): each engine
worker then gets a cgroup that inferenced can freeze, so an EmergencyTriage
lease stops lower lanes for real in dev mode too. Elsewhere the workers
share runtimed's cgroup, and a freeze is accounting only.
"""

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from syntrop.system import cgroup, process
from syntrop.varlink.server import bind_unix

#: prctl(2) option: the signal a process gets when its parent thread ends.
PR_SET_PDEATHSIG = 1

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Daemon:
    program: str
    module: str
    interface: str


DAEMONS = (
    Daemon("inferenced", "syntrop.inferenced", "io.syntrop.Inference1"),
    Daemon("modeld", "syntrop.modeld", "io.syntrop.Model1"),
    Daemon("contextd", "syntrop.contextd", "io.syntrop.Context1"),
    Daemon("toold", "syntrop.toold", "io.syntrop.Tool1"),
    Daemon("runtimed", "syntrop.runtimed", "io.syntrop.Runtime1"),
    Daemon("systemd-sentry", "syntrop.sentry", "io.syntrop.Sentry1"),
    Daemon("routerd", "syntrop.routerd", "io.syntrop.Router1"),
)


def default_directory() -> Path:
    """$SYNTROP_DEV_DIR, else $XDG_STATE_HOME/syntrop/dev (~/.local/state/…):
    writable without root."""
    explicit = os.environ.get("SYNTROP_DEV_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "syntrop" / "dev"


def is_launcher_directory(directory: Path) -> bool:
    return (directory / "status.json").exists() or (directory / "launcher.pid").exists()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except ProcessLookupError:
        return False
    return True


def launcher_pid(directory: Path) -> int | None:
    """The pid of the launcher running in `directory`, or None (no pid
    file, or the process it names is gone)."""
    try:
        pid = int((directory / "launcher.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def locate(explicit: Path | None = None) -> Path | None:
    """The dev suite syn works with, by one rule for every subcommand: --dir
    when given; else the launcher directory whose run/ $RUNTIME_DIRECTORY
    names; else the default dev directory while a launcher is up there;
    else None: the system suite (/run/syntrop, or $RUNTIME_DIRECTORY when
    it names no launcher directory)."""
    if explicit is not None:
        return explicit.resolve()
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    if runtime:
        above = Path(runtime.split(":")[0]).resolve().parent
        return above if is_launcher_directory(above) else None
    default = default_directory().resolve()
    return default if launcher_pid(default) is not None else None


def use_dev_suite() -> None:
    """Point $RUNTIME_DIRECTORY at the dev suite `locate` finds, unless it
    is set: what every command but syn's dev ones (which take --dir) calls
    first, so syn and routerctl find the suite `make run` started."""
    found = locate()
    if found is not None and not os.environ.get("RUNTIME_DIRECTORY"):
        os.environ["RUNTIME_DIRECTORY"] = str(found / "run")


@dataclass(slots=True)
class _State:
    pid: int | None = None
    starts: int = 0
    last_exit: int | None = None
    started_at: float | None = None
    #: routerd only: the HTTP addresses held for it, and those that failed.
    http: list[str] = field(default_factory=list)
    http_failed: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Slot:
    daemon: Daemon
    sock: socket.socket
    state: _State = field(default_factory=_State)
    #: More listening sockets passed after the Varlink one (routerd's HTTP).
    extra: list[socket.socket] = field(default_factory=list)
    #: The cgroup delegated to the running daemon (mount, path), if any.
    cgroup: tuple[Path, str] | None = None


def _address(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


#: Addresses for routerd's HTTP ingress instead of routerd.toml's
#: http.listen, comma-separated (`syn up --listen` sets it).
LISTEN = "SYNTROP_LISTEN"


def http_listeners(config: Path) -> tuple[list[socket.socket], list[str]]:
    """routerd's HTTP ingress bound now, as routerd.socket's ListenStream=
    would: the sockets, and for each address that failed, why. $SYNTROP_LISTEN
    overrides routerd.toml's http.listen."""
    from syntrop.config import ConfigError
    from syntrop.routerd import config as routerconfig

    override = [a.strip() for a in os.environ.get(LISTEN, "").split(",") if a.strip()]
    try:
        listen = override or routerconfig.load(config / "routerd.toml").listen
        for text in override:
            routerconfig.parse_address(text)
    except (ConfigError, ValueError) as error:
        return [], [str(error)]
    sockets: list[socket.socket] = []
    failed: list[str] = []
    for text in listen:
        where = routerconfig.parse_address(text)
        try:
            if isinstance(where, str):
                sock = bind_unix(where)
            else:
                family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    if family == socket.AF_INET6:
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    sock.bind(where)
                    sock.listen(socket.SOMAXCONN)
                except OSError:
                    sock.close()
                    raise
        except OSError as error:
            failed.append(f"{text}: {error.strerror or error}")
            continue
        sockets.append(sock)
    return sockets, failed


def daemon_environment(directory: Path, daemon: Daemon) -> dict[str, str]:
    """The directories a daemon gets, as systemd would set them."""
    env = {
        "RUNTIME_DIRECTORY": str(directory / "run"),
        "STATE_DIRECTORY": str(directory / "state" / daemon.program),
        "CACHE_DIRECTORY": str(directory / "cache" / daemon.program),
        "CONFIGURATION_DIRECTORY": str(directory / "config"),
    }
    for key in ("STATE_DIRECTORY", "CACHE_DIRECTORY", "CONFIGURATION_DIRECTORY"):
        os.makedirs(env[key], exist_ok=True)
    return env


def spawn_activated(
    argv: list[str], sock: socket.socket, env: dict[str, str], *, log: Path | None = None,
    extra: list[socket.socket] | None = None, procs: Path | None = None,
) -> int:
    """Start argv with `sock` as fd 3 (and `extra`, named "http", as fd 4
    on), the way systemd passes an Accept=no socket unit's descriptors.
    LISTEN_PID must be the new process's own pid, which only the child
    knows: hence fork and exec rather than subprocess. `procs`: a cgroup's
    cgroup.procs, which the child enters before it execs."""
    sockets = [sock, *(extra or ())]
    names = ":".join(["varlink"] + ["http"] * (len(sockets) - 1))
    environment = {**os.environ, **env, "LISTEN_FDS": str(len(sockets)),
                   "LISTEN_FDNAMES": names}
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    log_fd = os.open(log, flags, 0o644) if log else -1
    procs_fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC) if procs else -1
    # The daemons die with their launcher (as a service's processes with
    # the service): none is left running if it crashes. Resolved before the
    # fork; the child only makes the call.
    prctl = ctypes.CDLL(None).prctl
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only execs
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if procs_fd >= 0:
                os.write(procs_fd, b"0")  # this process, before it runs anything
            # The log first: it may itself be fd 3, which the socket replaces.
            if log_fd >= 0:
                os.dup2(log_fd, 2)
                os.dup2(log_fd, 1)
            # Out of the way first (a socket may sit on a target number),
            # then onto 3, 4, …: dup2 clears FD_CLOEXEC on each.
            high = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, 64) for s in sockets]
            for index, fd in enumerate(high):
                os.dup2(fd, 3 + index)
            environment["LISTEN_PID"] = str(os.getpid())
            os.execvpe(argv[0], argv, environment)
        finally:
            os._exit(127)
    for fd in (log_fd, procs_fd):
        if fd >= 0:
            os.close(fd)
    return pid


def delegated_cgroup(name: str) -> tuple[Path, str] | None:
    """As root on cgroup v2: cgroup `name` below the launcher's own, made
    now (the mount and its path); else None."""
    mount = cgroup.find_mount() if os.geteuid() == 0 else None
    own = cgroup.cgroup_of_pid(os.getpid()) if mount is not None else None
    if mount is None or own is None:
        return None
    try:
        return mount, cgroup.make_child(mount, own, name)
    except cgroup.CgroupError as error:
        logger.info("no cgroup of its own for %s: %s", name, error)
        return None


def remove_cgroup_tree(mount: Path, path: str) -> None:
    """Remove cgroup `path` and the cgroups below it that are empty."""
    for directory, _, _ in os.walk(mount / path.lstrip("/"), topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


class Launcher:
    def __init__(self, directory: Path, *, idle_timeout: float) -> None:
        self.directory = directory
        self.idle_timeout = idle_timeout
        self.slots: list[_Slot] = []
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()

    def bind(self) -> None:
        run = self.directory / "run"
        run.mkdir(parents=True, exist_ok=True)
        (self.directory / "log").mkdir(exist_ok=True)
        for daemon in DAEMONS:
            sock = bind_unix(run / daemon.interface)
            os.chmod(run / daemon.interface, 0o666)
            sock.setblocking(False)
            slot = _Slot(daemon, sock)
            if daemon.program == "routerd":
                slot.extra, slot.state.http_failed = http_listeners(self.directory / "config")
                slot.state.http = [_address(s) for s in slot.extra]
                for problem in slot.state.http_failed:
                    logger.warning("routerd's HTTP ingress: cannot listen on %s", problem)
            for each in slot.extra:
                each.setblocking(False)
            self.slots.append(slot)
            self._watch(slot)
        self._write_status()

    def _watch(self, slot: _Slot) -> None:
        for sock in (slot.sock, *slot.extra):
            self.loop.add_reader(sock.fileno(), self._spawn, slot)

    def _spawn(self, slot: _Slot) -> None:
        for sock in (slot.sock, *slot.extra):
            self.loop.remove_reader(sock.fileno())
        daemon = slot.daemon
        env = daemon_environment(self.directory, daemon)
        env["SYNTROP_IDLE_TIMEOUT"] = str(self.idle_timeout)
        argv = [sys.executable, "-m", daemon.module]
        procs = None
        if daemon.program == "runtimed":
            slot.cgroup = delegated_cgroup(f"syntrop-dev-{os.getpid()}-runtimed")
            if slot.cgroup is not None:
                mount, path = slot.cgroup
                procs = mount / path.lstrip("/") / "cgroup.procs"
                env["SYNTROP_DELEGATED"] = "1"
        pid = spawn_activated(
            argv, slot.sock, env, log=self.directory / "log" / f"{daemon.program}.log",
            extra=slot.extra, procs=procs,
        )
        slot.state.pid = pid
        slot.state.starts += 1
        slot.state.started_at = time.time()
        logger.info("started %s as pid %d", daemon.program, pid)
        # Our child: a zombie until reaped, so the watch always starts.
        process.watch_exit(pid, functools.partial(self._reap, slot, pid), self.loop)
        self._write_status()

    def _reap(self, slot: _Slot, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        slot.state.pid = None
        slot.state.last_exit = os.waitstatus_to_exitcode(status)
        code = slot.state.last_exit
        if code < 0:
            logger.warning("%s was killed by signal %d (%s)", slot.daemon.program, -code,
                           signal.Signals(-code).name if -code in signal.valid_signals()
                           else "unknown")
        else:
            logger.info("%s exited with %d", slot.daemon.program, code)
        if slot.cgroup is not None:
            remove_cgroup_tree(*slot.cgroup)
            slot.cgroup = None
        if not self.stopped.is_set():
            self._watch(slot)
        self._write_status()

    def _write_status(self) -> None:
        status = {slot.daemon.program: asdict(slot.state) for slot in self.slots}
        temporary = self.directory / "status.json.tmp"
        temporary.write_text(json.dumps(status, indent=2))
        temporary.replace(self.directory / "status.json")

    async def stop(self) -> None:
        self.stopped.set()
        for slot in self.slots:
            for sock in (slot.sock, *slot.extra):
                self.loop.remove_reader(sock.fileno())
            if slot.state.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.state.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while any(slot.state.pid for slot in self.slots) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for slot in self.slots:
            if slot.state.pid:
                os.kill(slot.state.pid, signal.SIGKILL)
            slot.sock.close()
            for sock in slot.extra:
                where = sock.getsockname() if sock.family == socket.AF_UNIX else None
                sock.close()
                if where:
                    with contextlib.suppress(OSError):
                        os.unlink(where)
            (self.directory / "run" / slot.daemon.interface).unlink(missing_ok=True)
            if slot.cgroup is not None:
                remove_cgroup_tree(*slot.cgroup)
        self._write_status()


async def serve(directory: Path, *, idle_timeout: float) -> None:
    launcher = Launcher(directory, idle_timeout=idle_timeout)
    try:
        launcher.bind()
    except OSError as error:  # e.g. a directory too deep for a socket path (108 bytes)
        logger.error("cannot bind the sockets in %s: %s", directory / "run",
                     error.strerror or error)
        raise SystemExit(1) from None
    for signum in (signal.SIGTERM, signal.SIGINT):
        launcher.loop.add_signal_handler(signum, launcher.stopped.set)
    (directory / "launcher.pid").write_text(f"{os.getpid()}\n")
    try:
        await launcher.stopped.wait()
    finally:
        await launcher.stop()
        (directory / "launcher.pid").unlink(missing_ok=True)


def main() -> None:
    """python -m syntrop.cli.launcher DIR [IDLE_SECONDS]: run in the foreground."""
    from syntrop.system import logging as syslog

    syslog.setup("syn-launcher")
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else default_directory()
    idle = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    asyncio.run(serve(directory, idle_timeout=idle))


if __name__ == "__main__":
    main()
