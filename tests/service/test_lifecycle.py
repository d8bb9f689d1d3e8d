"""How a daemon starts and ends: idle exit, sd_notify (READY, WATCHDOG,
STOPPING), SIGTERM, dev-mode binding, and sockets handed over already
connected (`varlinkctl exec:`, Accept=yes)."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from asyncvarlink import varlinksignature

from syntrop.cli.launcher import DAEMONS, Daemon
from tests.service.wire import (
    Reader,
    Running,
    assert_no_traceback,
    call,
    connect,
    daemon_env,
    daemon_named,
    encode,
    get_info,
    idl,
    running,
    service_class,
    streaming,
    unimplemented,
    valid_parameters,
    wait_for,
)
from tests.support import environment, stop

IDLE = 0.3

#: The daemon the start-up machinery is tested on: one with no state of its
#: own that could keep it up (contextd keeps recording while idle unless its
#: config says exit_on_idle; inferenced and modeld stay while leases or
#: pulls are live). What is tested here is syntrop.varlink.daemon's.
PLAIN = "toold"

#: Daemons that exit on idle when nothing was asked of them but failing calls.
IDLE_EXITING = [daemon for daemon in DAEMONS if daemon.program != "contextd"]


def _exited(daemon: Running, timeout: float = 5) -> int:
    """The exit status, waiting up to `timeout` seconds for it."""
    try:
        return daemon.process.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{daemon.daemon.program} still runs after {timeout} s") from None


# idle exit ---------------------------------------------------------------


def test_idle_daemon_exits_by_itself(tmp_path: Path) -> None:
    with running(PLAIN, tmp_path, idle_timeout=IDLE) as daemon:
        started = time.monotonic()
        assert _exited(daemon) == 0
        assert time.monotonic() - started >= IDLE * 0.8
        assert_no_traceback(daemon.log_text())


def test_open_connection_keeps_daemon_alive(tmp_path: Path) -> None:
    with running(PLAIN, tmp_path, idle_timeout=IDLE) as daemon:
        with connect(daemon.socket) as held:
            held.sendall(encode("org.varlink.service.GetInfo"))
            assert Reader(held).next() is not None
            time.sleep(IDLE * 3)
            assert daemon.process.poll() is None, "exited while a client was connected"
            held.sendall(encode("org.varlink.service.GetInfo"))
            reply = Reader(held).next()
            assert reply is not None and reply["parameters"]["product"] == PLAIN
        assert _exited(daemon) == 0
        assert_no_traceback(daemon.log_text())


def _async_call() -> tuple[Daemon, bytes]:
    """A harmless call that runs as a task in its daemon: an unimplemented
    method (the contract's stubs are coroutines), else releasing a lease
    that does not exist, if inferenced does that in a coroutine."""
    for daemon in IDLE_EXITING:
        names = [name for name in unimplemented(daemon) if name not in streaming(daemon)]
        if names:
            parameters = valid_parameters(idl(daemon), names[0])
            return daemon, encode(f"{daemon.interface}.{names[0]}", parameters)
    inferenced = daemon_named("inferenced")
    release = getattr(service_class(inferenced), "ReleaseLease", None)
    signature = None if release is None else varlinksignature(release)
    if signature is None or not signature.asynchronous:
        pytest.skip("no harmless call runs as a task")
    return inferenced, encode(f"{inferenced.interface}.ReleaseLease", {"lease_id": "no-such-lease"})


@pytest.mark.parametrize("rude", [False, True], ids=["close", "reset"])
def test_idle_exit_after_clients_vanish_mid_call(tmp_path: Path, rude: bool) -> None:
    daemon_kind, data = _async_call()
    with running(daemon_kind, tmp_path, idle_timeout=IDLE) as daemon:
        for _ in range(5):
            with connect(daemon.socket) as sock:
                sock.sendall(data)
                if rude:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        assert _exited(daemon) == 0
        assert_no_traceback(daemon.log_text())


def test_idle_exit_after_a_stream_is_abandoned(tmp_path: Path) -> None:
    with running("inferenced", tmp_path, idle_timeout=IDLE) as daemon:
        for _ in range(5):
            with connect(daemon.socket) as sock:
                sock.sendall(
                    encode(
                        "io.syntrop.Inference1.StreamInference",
                        {"model": "no-such-model", "prompt": "p"},
                        more=True,
                    )
                )
        assert _exited(daemon) == 0
        assert_no_traceback(daemon.log_text())


def test_malformed_idle_timeout_is_ignored_with_a_warning(tmp_path: Path) -> None:
    with running(PLAIN, tmp_path, extra_env={"SYNTROP_IDLE_TIMEOUT": "soon"}) as daemon:
        daemon.assert_healthy()
        assert (
            "SYNTROP_IDLE_TIMEOUT='soon' is not a non-negative number, ignoring"
            in daemon.log_text()
        )


# sd_notify -----------------------------------------------------------------


@contextlib.contextmanager
def _notify_socket(path: Path | str) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    with sock:
        sock.bind(os.fspath(path) if not str(path).startswith("@") else "\0" + str(path)[1:])
        sock.settimeout(5)
        yield sock


def _messages(sock: socket.socket, until: str, timeout: float = 5) -> list[str]:
    """Datagrams received until one contains the assignment `until`."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            datagram = sock.recv(4096).decode()
        except TimeoutError:
            raise AssertionError(f"no {until} within {timeout} s; got {got}") from None
        got.append(datagram)
        if until in datagram.split("\n"):
            return got


def _drain(sock: socket.socket, seconds: float) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    return got


def test_ready_then_stopping_and_exit_zero_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    env = {"NOTIFY_SOCKET": str(path)}
    with _notify_socket(path) as notify, running("modeld", tmp_path, extra_env=env) as daemon:
        ready = _messages(notify, "READY=1")
        assert any("STATUS=" in message for message in ready)
        # No watchdog was asked for, so none is sent.
        assert not any("WATCHDOG=1" in message for message in _drain(notify, 0.3))
        with connect(daemon.socket) as held:
            held.sendall(encode("org.varlink.service.GetInfo"))
            assert Reader(held).next() is not None
            # A connected client does not hold up the stop.
            os.kill(daemon.pid, signal.SIGTERM)
            assert _exited(daemon) == 0
            assert Reader(held).next() is None  # the daemon closed our connection
        _messages(notify, "STOPPING=1")
        assert_no_traceback(daemon.log_text())


def test_ready_on_abstract_notify_socket(tmp_path: Path) -> None:
    name = f"@syntrop-test-notify-{os.getpid()}-{time.monotonic_ns()}"
    with (
        _notify_socket(name) as notify,
        running("routerd", tmp_path, extra_env={"NOTIFY_SOCKET": name}),
    ):
        _messages(notify, "READY=1")


def test_watchdog_pings_at_half_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "200000"}  # pings every 0.1 s
    with _notify_socket(path) as notify, running(PLAIN, tmp_path, extra_env=env):
        _messages(notify, "READY=1")
        pings = [message for message in _drain(notify, 0.65) if "WATCHDOG=1" in message.split("\n")]
        assert 4 <= len(pings) <= 9, pings


def test_watchdog_for_another_pid_is_not_ours(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}
    with _notify_socket(path) as notify, running(PLAIN, tmp_path, extra_env=env):
        _messages(notify, "READY=1")
        assert not any("WATCHDOG=1" in message for message in _drain(notify, 0.4))


# dev mode: binding the socket itself --------------------------------------------


@contextlib.contextmanager
def _direct(daemon: Daemon, root: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run the daemon without activation: it binds $RUNTIME_DIRECTORY/<interface>."""
    with open(log, "ab") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", daemon.module],
            env=daemon_env(root, daemon),
            stdin=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        stop(process)


def test_second_daemon_cannot_take_a_served_socket(tmp_path: Path) -> None:
    daemon = daemon_named(PLAIN)
    path = tmp_path / "run" / daemon.interface
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with _direct(daemon, tmp_path, first_log) as first:
        wait_for(
            lambda: _answers(path),
            10,
            lambda: f"first daemon never served:\n{first_log.read_text()}",
        )
        with _direct(daemon, tmp_path, second_log) as second:
            assert second.wait(10) == 1
        log = second_log.read_text()
        assert f"cannot serve {daemon.interface}" in log and "served already" in log, log
        assert_no_traceback(log)
        assert get_info(path)["product"] == PLAIN
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        assert first.wait(5) == 0
    assert_no_traceback(first_log.read_text())


def test_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    daemon = daemon_named(PLAIN)
    path = tmp_path / "run" / daemon.interface
    path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(os.fspath(path))  # a socket file nobody listens on
    with _direct(daemon, tmp_path, tmp_path / "toold.log"):
        wait_for(lambda: _answers(path), 10, lambda: (tmp_path / "toold.log").read_text())
    assert_no_traceback((tmp_path / "toold.log").read_text())


def _answers(path: Path) -> bool:
    try:
        return call(path, "org.varlink.service.GetInfo") is not None
    except (FileNotFoundError, ConnectionRefusedError):
        return False


# connected sockets ---------------------------------------------------------

#: What `varlinkctl call exec:` does before exec: the connected socket as
#: fd 3, LISTEN_FDS=1, LISTEN_FDNAMES=varlink, LISTEN_PID = own pid.
_EXEC_LIKE = (
    "import os, sys\n"
    "fd = int(sys.argv[1])\n"
    "os.dup2(fd, 3)\n"
    "if fd != 3: os.close(fd)\n"
    "os.environ.update(LISTEN_FDS='1', LISTEN_FDNAMES='varlink', LISTEN_PID=str(os.getpid()))\n"
    "os.execv(sys.executable, [sys.executable, '-m', sys.argv[2]])\n"
)


def test_connected_socket_is_served_until_the_client_leaves(tmp_path: Path) -> None:
    daemon = daemon_named(PLAIN)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    log = tmp_path / f"{PLAIN}.log"
    env = daemon_env(tmp_path, daemon)
    with ours, open(log, "ab") as stderr:
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-c", _EXEC_LIKE, str(theirs.fileno()), daemon.module],
                env=env,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        try:
            ours.settimeout(10)
            reader = Reader(ours)
            for _ in range(3):
                ours.sendall(encode("org.varlink.service.GetInfo"))
                reply = reader.next()
                assert reply is not None and reply["parameters"]["product"] == PLAIN
            ours.close()
            assert process.wait(5) == 0
        finally:
            stop(process)
    assert not (tmp_path / "run" / daemon.interface).exists(), "bound its own socket instead"
    assert_no_traceback(log.read_text())


def test_accept_yes_serves_each_connection_with_its_own_instance(tmp_path: Path) -> None:
    tool = shutil.which("systemd-socket-activate")
    assert tool is not None
    daemon = daemon_named(PLAIN)
    env = environment(tmp_path, daemon)
    path = tmp_path / "accept.sock"
    log = tmp_path / "accept.log"
    argv = [
        tool,
        "--accept",
        "-l",
        str(path),
        "--fdname=varlink",
        *(f"-E{key}={value}" for key, value in env.items()),
        "-EPYTHONPATH=" + os.environ.get("PYTHONPATH", ""),
        sys.executable,
        "-m",
        daemon.module,
    ]
    with open(log, "ab") as stderr:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    try:
        wait_for(lambda: _answers(path), 10, lambda: log.read_text())
        instances = []
        for _ in range(2):
            with connect(path) as sock:
                sock.sendall(encode("org.varlink.service.GetInfo"))
                reply = Reader(sock).next()
                assert reply is not None and reply["parameters"]["product"] == PLAIN
                instances.append(_children_of(process.pid))
            # The instance exits once its client is gone.
            wait_for(
                lambda: not _children_of(process.pid),
                5,
                "an Accept=yes instance outlived its client",
            )
        assert all(len(pids) == 1 for pids in instances), instances
        assert instances[0] != instances[1], "both connections were served by one process"
    finally:
        stop(process)
    assert_no_traceback(log.read_text())


def _children_of(parent: int) -> set[int]:
    """Live children of `parent`, from /proc."""
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == parent:
            children.add(int(entry))
    return children


# what a cold start loads -------------------------------------------------------


@pytest.mark.parametrize("daemon_kind", DAEMONS, ids=lambda d: d.program)
def test_a_cold_start_maps_no_tls_library(tmp_path: Path, daemon_kind: Daemon) -> None:
    """asyncio would import ssl (libssl, a few ms of every cold start and
    MiBs of mappings); no daemon speaks TLS unless routerd is configured to
    (syntrop.system.lazyssl), so none has it after its first reply."""
    with running(daemon_kind, tmp_path) as daemon:
        maps = Path(f"/proc/{daemon.pid}/maps").read_text()
        assert "libssl" not in maps, daemon.daemon.program
        daemon.assert_healthy()
