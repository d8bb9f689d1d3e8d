"""The dev launcher behind `syn up`: socket activation without systemd as PID 1.

It does for the seven daemons what systemd does with Accept=no .socket units:
bind every socket first, then spawn a daemon on the first connection to its
socket, handing it the listening socket as fd 3 with LISTEN_FDS=1,
LISTEN_FDNAMES=varlink and LISTEN_PID set to the daemon's own pid. While the
daemon runs, the launcher ignores that socket; when the daemon exits (idle,
crash), the launcher watches it again, so the next connection starts it anew.

Layout of a launcher directory DIR:

    DIR/run/io.syntrop.<Name>1   the sockets (RUNTIME_DIRECTORY)
    DIR/state/<daemon>/          STATE_DIRECTORY of each daemon
    DIR/cache/<daemon>/          CACHE_DIRECTORY
    DIR/config/                  CONFIGURATION_DIRECTORY (shared)
    DIR/log/<daemon>.log         the daemon's stderr
    DIR/launcher.pid             the launcher's pid
    DIR/status.json              per daemon: pid, starts, last exit status
"""

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

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


@dataclass(slots=True)
class _State:
    pid: int | None = None
    starts: int = 0
    last_exit: int | None = None
    started_at: float | None = None


@dataclass(slots=True)
class _Slot:
    daemon: Daemon
    sock: socket.socket
    state: _State = field(default_factory=_State)


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
    argv: list[str], sock: socket.socket, env: dict[str, str], *, log: Path | None = None
) -> int:
    """Start argv with `sock` as fd 3, the way systemd passes an Accept=no
    socket. LISTEN_PID must be the new process's own pid, which only the
    child knows: hence fork and exec rather than subprocess."""
    environment = {**os.environ, **env, "LISTEN_FDS": "1", "LISTEN_FDNAMES": "varlink"}
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    log_fd = os.open(log, flags, 0o644) if log else -1
    # The daemons die with their launcher (as a service's processes with
    # the service): none is left running if it crashes. Resolved before the
    # fork; the child only makes the call.
    prctl = ctypes.CDLL(None).prctl
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only execs
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # The log first: it may itself be fd 3, which the socket replaces.
            if log_fd >= 0:
                os.dup2(log_fd, 2)
                os.dup2(log_fd, 1)
            if sock.fileno() == 3:
                os.set_inheritable(3, True)  # dup2(3, 3) would leave FD_CLOEXEC set
            else:
                os.dup2(sock.fileno(), 3)  # dup2 clears FD_CLOEXEC on fd 3
            environment["LISTEN_PID"] = str(os.getpid())
            os.execvpe(argv[0], argv, environment)
        finally:
            os._exit(127)
    if log_fd >= 0:
        os.close(log_fd)
    return pid


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
            self.slots.append(slot)
            self._watch(slot)
        self._write_status()

    def _watch(self, slot: _Slot) -> None:
        self.loop.add_reader(slot.sock.fileno(), self._spawn, slot)

    def _spawn(self, slot: _Slot) -> None:
        self.loop.remove_reader(slot.sock.fileno())
        daemon = slot.daemon
        env = daemon_environment(self.directory, daemon)
        env["SYNTROP_IDLE_TIMEOUT"] = str(self.idle_timeout)
        argv = [sys.executable, "-m", daemon.module]
        pid = spawn_activated(
            argv, slot.sock, env, log=self.directory / "log" / f"{daemon.program}.log"
        )
        slot.state.pid = pid
        slot.state.starts += 1
        slot.state.started_at = time.time()
        logger.info("started %s as pid %d", daemon.program, pid)
        pidfd = os.pidfd_open(pid)
        self.loop.add_reader(pidfd, self._reap, slot, pid, pidfd)
        self._write_status()

    def _reap(self, slot: _Slot, pid: int, pidfd: int) -> None:
        self.loop.remove_reader(pidfd)
        os.close(pidfd)
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
            self.loop.remove_reader(slot.sock.fileno())
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
            (self.directory / "run" / slot.daemon.interface).unlink(missing_ok=True)
        self._write_status()


async def serve(directory: Path, *, idle_timeout: float) -> None:
    launcher = Launcher(directory, idle_timeout=idle_timeout)
    launcher.bind()
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
