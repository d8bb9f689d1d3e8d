"""Helpers of the service tier: the Varlink wire by hand, and daemons whose
stderr goes to a file so a test can assert that no traceback was logged.

The wire helpers are deliberately independent of syntrop.varlink: a raw
socket, json and a NUL byte are all a Varlink client needs, and what our
server must cope with. The contract helpers read the IDL with python-varlink
and ask the service classes which methods are still unimplemented, so tests
keep working as implementations land.
"""

import contextlib
import functools
import importlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import varlink
from asyncvarlink import varlinksignature

from syntrop.cli.launcher import DAEMONS, Daemon
from syntrop.varlink.contract import Interface
from tests.support import INTERFACES, Activated, activated, environment

#: Seconds any single socket operation of a test may block.
IO_TIMEOUT = 10.0

Reply = dict[str, Any]


# the wire ------------------------------------------------------------------


def connect(path: str | os.PathLike[str], *, timeout: float = IO_TIMEOUT) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(os.fspath(path))
    except BaseException:
        sock.close()
        raise
    return sock


def encode(method: str, parameters: dict[str, Any] | None = None, **flags: bool) -> bytes:
    message: dict[str, Any] = {"method": method}
    if parameters is not None:
        message["parameters"] = parameters
    message.update(flags)
    return json.dumps(message).encode() + b"\0"


class Reader:
    """Splits what a socket receives into NUL-terminated replies."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def next(self) -> Reply | None:
        """The next reply, or None when the server closed the connection.
        socket.timeout (TimeoutError) propagates: a server that neither
        answers nor closes is a failure."""
        while b"\0" not in self.buffer:
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                return None
            if not data:
                assert not self.buffer, f"connection closed inside a reply: {self.buffer[:200]!r}"
                return None
            self.buffer += data
        message, _, self.buffer = self.buffer.partition(b"\0")
        reply = json.loads(message)
        assert isinstance(reply, dict), reply
        return reply


def call(
    path: str | os.PathLike[str],
    method: str,
    parameters: dict[str, Any] | None = None,
    **flags: bool,
) -> Reply | None:
    """One call on a fresh connection: its (first) reply, None if closed."""
    with connect(path) as sock:
        sock.sendall(encode(method, parameters, **flags))
        return Reader(sock).next()


def send_raw(path: str | os.PathLike[str], data: bytes) -> Reply | None:
    """Send bytes on a fresh connection; the first reply, or None if closed."""
    with connect(path) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return None
        return Reader(sock).next()


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (reads EOF or a reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def error_of(reply: Reply | None) -> str | None:
    assert reply is not None, "the server closed the connection instead of answering"
    return reply.get("error")


def get_info(path: str | os.PathLike[str]) -> Reply:
    reply = call(path, "org.varlink.service.GetInfo")
    assert reply is not None and "error" not in reply, reply
    parameters = reply["parameters"]
    assert isinstance(parameters, dict)
    return parameters


# daemons -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Running:
    """A socket-activated daemon whose stderr is `log`."""

    activated: Activated
    log: Path

    @property
    def daemon(self) -> Daemon:
        return self.activated.daemon

    @property
    def socket(self) -> Path:
        return self.activated.socket

    @property
    def address(self) -> str:
        return self.activated.address

    @property
    def pid(self) -> int:
        return self.activated.process.pid

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.activated.process

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def settled_fds(self) -> int:
        """open_fds() once the daemon has caught up with closes in flight."""
        previous = -1
        for _ in range(100):
            current = self.open_fds()
            if current == previous:
                return current
            previous = current
            time.sleep(0.05)
        raise AssertionError("the daemon's descriptor count does not settle")

    def assert_healthy(self) -> None:
        """Alive, answering GetInfo on a fresh connection, no traceback."""
        assert self.process.poll() is None, (
            f"{self.daemon.program} exited with {self.process.returncode}:\n{self.log_text()}"
        )
        assert get_info(self.socket)["product"] == self.daemon.program
        assert_no_traceback(self.log_text())


def assert_no_traceback(log: str) -> None:
    assert "Traceback" not in log, f"the daemon logged a traceback:\n{log}"
    assert "Exception in callback" not in log, f"the event loop caught an exception:\n{log}"


def daemon_named(name: str) -> Daemon:
    return next(d for d in DAEMONS if name in (d.program, d.interface))


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point this process's fd 2 at `path` while a child is spawned, so the
    child inherits it (tests.support.activated has no stderr argument)."""
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


@contextlib.contextmanager
def _nofile_soft(limit: int | None) -> Iterator[None]:
    """Lower this process's soft RLIMIT_NOFILE while a child is spawned."""
    if limit is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def running(
    daemon: Daemon | str,
    root: Path,
    *,
    idle_timeout: float = 0,
    extra_env: dict[str, str] | None = None,
    nofile_soft: int | None = None,
    start: bool = True,
) -> Iterator[Running]:
    """tests.support.activated, with stderr captured to root/<program>.log.

    systemd-socket-activate execs the daemon on the first connection; with
    `start` we make that connection (a GetInfo) so the daemon is up and its
    pid is the Python process when this yields."""
    if isinstance(daemon, str):
        daemon = daemon_named(daemon)
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{daemon.program}.log"
    with contextlib.ExitStack() as stack:
        with _stderr_to(log), _nofile_soft(nofile_soft):
            act = stack.enter_context(
                activated(daemon, root, idle_timeout=idle_timeout, extra_env=extra_env)
            )
        result = Running(act, log)
        if start:
            _first_call(result)
        yield result


def _first_call(daemon: Running, timeout: float = 10) -> None:
    """GetInfo, retried while connect() is refused: the activator binds the
    path before it calls listen(), and tests.support.activated only waits
    for the path to exist."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            get_info(daemon.socket)
            return
        except ConnectionRefusedError:
            if daemon.process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def daemon_env(root: Path, daemon: Daemon, **extra: str) -> dict[str, str]:
    """An environment for running `daemon` directly (no activator): ours
    without activation or notify variables, plus the daemon's directories."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("LISTEN_", "NOTIFY_SOCKET", "WATCHDOG_", "SYNTROP_"))
    }
    env.update(environment(root, daemon))
    env.update(extra)
    return env


def wait_for(
    predicate: Callable[[], object], timeout: float, message: str | Callable[[], str]
) -> None:
    """Poll `predicate` until true; fail with `message` (called, if it is a
    function, at the time of failure) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(0.01)


# contracts -----------------------------------------------------------------


def idl_text(daemon: Daemon) -> str:
    return (INTERFACES / f"{daemon.interface}.varlink").read_text()


@functools.cache
def idl(daemon: Daemon) -> varlink.Interface:
    """The daemon's interface as python-varlink parses the file."""
    return varlink.Interface(idl_text(daemon))


def service_class(daemon: Daemon) -> type[Interface]:
    """The class the daemon serves: the one in <package>.service that
    derives from a contract and carries the daemon's interface name."""
    module = importlib.import_module(f"{daemon.module}.service")
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, Interface)
            and value.__module__ == module.__name__
            and value.name == daemon.interface
        ):
            return value
    raise LookupError(f"no service class for {daemon.interface} in {module.__name__}")


def unimplemented(daemon: Daemon) -> list[str]:
    """Methods the daemon still inherits unchanged from its contract, which
    answer MethodNotImplemented. Shrinks as implementations land."""
    service = service_class(daemon)
    contract = next(
        base
        for base in service.__mro__[1:]
        if issubclass(base, Interface) and base.name == daemon.interface
    )
    return [
        name
        for name, _ in contract.contract_methods()
        if getattr(service, name) is getattr(contract, name)
    ]


def streaming(daemon: Daemon) -> set[str]:
    """Methods that must be called with "more" (the IDL cannot say so; the
    contract's signature does)."""
    service = service_class(daemon)
    return {
        name
        for name, _ in service.contract_methods()
        if (signature := varlinksignature(getattr(service, name))) is not None and signature.more
    }


def valid_value(interface: varlink.Interface, vtype: Any) -> Any:
    """A value of the IDL type `vtype` (python-varlink's parse), the
    simplest that type checks."""
    from varlink.scanner import _Alias, _Array, _CustomType, _Dict, _Enum, _Maybe, _Object, _Struct

    if isinstance(vtype, _Maybe):
        return None
    if isinstance(vtype, _Array):
        return []
    if isinstance(vtype, _Dict | set):
        return {}
    if isinstance(vtype, _Object):
        return {}
    if isinstance(vtype, _CustomType):
        return valid_value(interface, interface.members[vtype.name])
    if isinstance(vtype, _Alias):
        return valid_value(interface, vtype.type)
    if isinstance(vtype, _Enum):
        return vtype.fields[0]
    if isinstance(vtype, _Struct):
        return {name: valid_value(interface, field) for name, field in vtype.fields.items()}
    if isinstance(vtype, bool):
        return True
    if isinstance(vtype, int):
        return 1
    if isinstance(vtype, float):
        return 1.5
    if isinstance(vtype, str):
        return "x"
    raise TypeError(f"unknown IDL type {vtype!r}")


def valid_parameters(interface: varlink.Interface, method: str) -> dict[str, Any]:
    parameters = valid_value(interface, interface.get_method(method).in_type)
    assert isinstance(parameters, dict)
    return parameters
