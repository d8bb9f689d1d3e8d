"""Fixtures of the service tier: real daemons under systemd-socket-activate,
stderr captured, shared across the tier where a test leaves them as it found
them (each such test ends with `assert_healthy()`)."""

import socket
from collections.abc import Iterator

import pytest

from syntrop.cli.launcher import DAEMONS, Daemon
from tests.service.wire import IO_TIMEOUT, Running, running
from tests.support import varlinkctl


@pytest.fixture(autouse=True)
def _socket_timeout() -> Iterator[None]:
    """No test blocks forever on a socket, python-varlink's included (it
    makes blocking sockets without a timeout)."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(IO_TIMEOUT)
    yield
    socket.setdefaulttimeout(previous)


@pytest.fixture(scope="package", params=DAEMONS, ids=lambda daemon: daemon.program)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """Each of the seven daemons, socket-activated, shared by the tier."""
    daemon: Daemon = request.param
    with running(daemon, tmp_path_factory.mktemp(daemon.program)) as daemon_running:
        yield daemon_running
        daemon_running.assert_healthy()


@pytest.fixture(scope="package")
def inferenced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One inferenced that the bad-input and fuzz tests throw things at."""
    with running("inferenced", tmp_path_factory.mktemp("target")) as daemon_running:
        yield daemon_running
        daemon_running.assert_healthy()


@pytest.fixture(scope="session")
def varlinkctl_bin() -> str:
    found = varlinkctl()
    if found is None:
        pytest.skip("varlinkctl not found (run scripts/fetch-varlinkctl or set $VARLINKCTL)")
    return found
