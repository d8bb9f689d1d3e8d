"""Connection limits of a real daemon: many idle clients, the per-UID and
total caps (set through the environment), and the descriptor limit."""

import contextlib
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.wire import (
    Reader,
    Running,
    closed_by_peer,
    connect,
    encode,
    get_info,
    running,
    wait_for,
)

IDLE_CLIENTS = 1000


def _nofile(pid: int | str) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no 'Max open files' in /proc/PID/limits")


@contextlib.contextmanager
def _enough_descriptors(needed: int) -> Iterator[None]:
    """Let this test process hold `needed` sockets, or skip."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < needed:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {needed}")
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _served(sock: socket.socket) -> bool:
    sock.sendall(encode("org.varlink.service.GetInfo"))
    reply = Reader(sock).next()
    return reply is not None and "parameters" in reply


def test_thousand_idle_connections_do_not_starve_a_new_client(tmp_path: Path) -> None:
    needed = IDLE_CLIENTS + 200
    with _enough_descriptors(needed), contextlib.ExitStack() as stack:
        # Started with a soft limit too small for the clients: the daemon
        # must raise it to the hard limit itself.
        small = 512
        daemon = stack.enter_context(running("modeld", tmp_path, nofile_soft=small))
        soft, hard = _nofile(daemon.pid)
        assert soft == hard, f"daemon kept soft RLIMIT_NOFILE {soft} below hard {hard}"
        assert soft >= needed

        baseline = daemon.settled_fds()
        clients = [stack.enter_context(connect(daemon.socket)) for _ in range(IDLE_CLIENTS)]
        wait_for(
            lambda: daemon.open_fds() >= baseline + IDLE_CLIENTS,
            10,
            lambda: (
                f"daemon accepted only {daemon.open_fds() - baseline} of {IDLE_CLIENTS} connections"
            ),
        )
        started = time.monotonic()
        assert get_info(daemon.socket)["product"] == "modeld"
        elapsed = time.monotonic() - started
        assert elapsed < 2, f"GetInfo took {elapsed:.2f} s with {IDLE_CLIENTS} idle clients"
        # The first and the last of them are served too.
        assert _served(clients[0]) and _served(clients[-1])

        for client in clients:
            client.close()
        wait_for(
            lambda: daemon.open_fds() <= baseline,
            10,
            lambda: (
                f"daemon still holds {daemon.open_fds() - baseline} descriptors of closed clients"
            ),
        )
        daemon.assert_healthy()


def _cap_test(tmp_path: Path, variable: str, message: str) -> None:
    cap = 3
    with running("toold", tmp_path, extra_env={variable: str(cap)}) as daemon:
        with contextlib.ExitStack() as stack:
            held = [stack.enter_context(connect(daemon.socket)) for _ in range(cap)]
            assert all(_served(sock) for sock in held)
            with connect(daemon.socket) as refused:
                assert closed_by_peer(refused)
            assert message in daemon.log_text()
            # Those admitted are unaffected.
            assert all(_served(sock) for sock in held)
            held[0].close()
            # A slot is free again once the daemon has seen the close.
            wait_for(lambda: _try_get_info(daemon), 5, "no slot came free after a client left")
        daemon.assert_healthy()


def _try_get_info(daemon: Running) -> bool:
    with connect(daemon.socket) as sock:
        try:
            return _served(sock)
        except (BrokenPipeError, ConnectionResetError):
            return False


def test_per_uid_cap_refuses_extra_connections(tmp_path: Path) -> None:
    _cap_test(tmp_path, "SYNTROP_MAX_CONNECTIONS_PER_UID", "per-UID connection limit 3 reached")


def test_total_cap_refuses_extra_connections(tmp_path: Path) -> None:
    _cap_test(tmp_path, "SYNTROP_MAX_CONNECTIONS", "connection limit 3 reached")


def test_bad_limit_values_are_ignored_with_a_warning(tmp_path: Path) -> None:
    env = {
        "SYNTROP_MAX_CONNECTIONS_PER_UID": "lots",
        "SYNTROP_MAX_CONNECTIONS": "-1",
    }
    with running("toold", tmp_path, extra_env=env) as daemon:
        with contextlib.ExitStack() as stack:
            held = [stack.enter_context(connect(daemon.socket)) for _ in range(5)]
            assert all(_served(sock) for sock in held)
        log = daemon.log_text()
        assert (
            "SYNTROP_MAX_CONNECTIONS_PER_UID='lots' is not a non-negative number, ignoring" in log
        )
        assert "SYNTROP_MAX_CONNECTIONS='-1' is not a non-negative number, ignoring" in log
        daemon.assert_healthy()
