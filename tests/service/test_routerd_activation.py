"""routerd's HTTP ingress from socket activation, as routerd.socket passes
it: the Varlink socket and the HTTP listeners (TCP and Unix) all under one
name; the first HTTP connection starts routerd (cold), which serves HTTP on
the passed sockets and Varlink beside them, and does not load ssl."""

import http.client
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import varlink

from syntrop.cli.launcher import DAEMONS
from tests.support import dies_with_us, environment, stop

DAEMON = next(d for d in DAEMONS if d.program == "routerd")


@dataclass
class Activated:
    process: subprocess.Popen[bytes]
    port: int
    varlink: Path
    http_unix: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def activated(tmp_path: Path) -> Iterator[Activated]:
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        pytest.skip("systemd-socket-activate is not installed (package systemd)")
    env = environment(tmp_path, DAEMON)
    port = _free_port()
    varlink_path, http_path = tmp_path / "run" / DAEMON.interface, tmp_path / "run" / "router.sock"
    process = subprocess.Popen(dies_with_us(
        [tool, "-l", str(varlink_path), "-l", f"127.0.0.1:{port}", "-l", str(http_path),
         "--fdname=varlink", *(f"-E{key}={value}" for key, value in env.items()),
         "-ESYNTROP_IDLE_TIMEOUT=0", "-EPYTHONPATH=" + os.environ.get("PYTHONPATH", ""),
         sys.executable, "-m", DAEMON.module]),
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not http_path.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(0.05)  # all three are bound once the last one exists
        yield Activated(process, port, varlink_path, http_path)
    finally:
        stop(process)


def test_first_http_request_activates_routerd_on_the_passed_sockets(
        activated: Activated) -> None:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", activated.port, timeout=10)
    connection.request("GET", "/health")
    response = connection.getresponse()
    response.read()
    cold = time.perf_counter() - started
    connection.close()
    assert response.status == 200
    print(f"routerd cold activation to first 200: {cold * 1000:.0f} ms")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(activated.http_unix))
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    client = varlink.Client(address=f"unix:{activated.varlink}")
    with client.open(DAEMON.interface) as router:
        status = router.GetStatus()
    client.cleanup()
    assert set(status["ingress"]) == {f"127.0.0.1:{activated.port}",
                                      f"unix:{activated.http_unix}"}
    # No TLS configured: libssl never mapped (about 4 MiB of the 24 MiB budget).
    maps = Path(f"/proc/{activated.process.pid}/maps").read_text()
    assert "libssl" not in maps and "_ssl" not in maps
