"""Who is a fleet member to routerd's ingress: only a connection over
mutual TLS (tls_listen) from a certificate tls_client_ca signed. From
anyone else x-syntrop-forwarded is ignored and /v1/syntrop/prefill is an
unknown endpoint (404). A prefill's state is sent holding its admission
place, and a client that stops reading it is cut off (http.body_timeout):
the place and the state are given back. Real listeners on loopback, a real
gateway, runtimed's Prefill a stand-in."""

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from syntrop.config import ConfigError, Paths
from syntrop.routerd.api import Response
from syntrop.routerd.config import Config, FleetConfig, ProviderConfig
from syntrop.routerd.gateway import Gateway
from syntrop.routerd.http import HTTPServer
from syntrop.routerd.pressure import Pressure
from syntrop.routerd.providers import Capabilities
from syntrop.routerd.queues import USER
from syntrop.routerd.service import check_fleet
from syntrop.routerd.tls import server_context
from tests.fleet import certificates

LOCAL = ProviderConfig(id="local", kind="runtimed", tier="local", models=("m",))
MEMBER = ProviderConfig(id="fleet:b", kind="peer", endpoint="http://b:1/v1", tier="lan",
                        models=("m",))
FLEET = FleetConfig(etcd=("http://e:1",), node="a", advertise="http://a:1/v1")
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}).encode()
STATE_NAME = "syntrop-test-state"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return certificates(tmp_path_factory.mktemp("certs"))


class Runtimed:
    """Stands in for this node's runtimed: a prefill's state is a memfd of
    `size` bytes (sparse: zeros)."""

    capabilities = Capabilities(load=True, prefill=True)
    config = LOCAL

    def __init__(self, size: int) -> None:
        self.size = size
        self.fds: list[int] = []

    async def prefill(self, request: dict[str, Any]) -> int:
        fd = os.memfd_create(STATE_NAME, os.MFD_CLOEXEC)
        os.ftruncate(fd, self.size)
        self.fds.append(fd)
        return fd

    def open_states(self) -> int:
        """How many of the states it gave are still open."""
        count = 0
        for fd in self.fds:
            with contextlib.suppress(OSError):  # closed
                count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{STATE_NAME}")
        return count


def gateway(size: int, body_timeout: float = 30.0) -> tuple[Gateway, Runtimed, Config]:
    config = Config(listen=(), providers=(LOCAL,), fleet=FLEET, body_timeout=body_timeout)
    found = Gateway(config, Paths.from_environment(),
                    pressure=Pressure(25.0, read=lambda: 0.0))
    found.registry.set_fleet((MEMBER,))
    runtimed = Runtimed(size)
    found.registry.providers["local"] = runtimed  # type: ignore[assignment]
    return found, runtimed, config


def client_context(certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
    return context


async def listen(server: HTTPServer, certs: Path) -> tuple[int, int]:
    """The plain port and the mutual-TLS one."""
    await server.start(("127.0.0.1:0",))
    await server.start(("127.0.0.1:0",), tls=server_context(
        str(certs / "server.pem"), str(certs / "server.key"), str(certs / "ca.pem")))
    plain, secure = (int(a.rpartition(":")[2]) for a in server.addresses)
    return plain, secure


def request(path: str, body: bytes) -> bytes:
    """A POST marked forwarded, as a member sends it (and anyone could)."""
    return (b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"x-syntrop-forwarded: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (path.encode(), len(body), body))


async def ask(port: int, path: str, body: bytes,
              tls: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """The status and the whole answer (head and body)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1" if tls else None)
    try:
        writer.write(request(path, body))
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]), answer


def run(certs: Path, gateway: Any, test: Callable[[int, int], Awaitable[None]],
        config: Config | None = None) -> None:
    async def serve() -> None:
        server = HTTPServer(gateway, config or Config(listen=()))
        try:
            await test(*await listen(server, certs))
        finally:
            await server.close()

    asyncio.run(serve())


class Recorder:
    """A gateway that answers 200 and remembers whether each request came
    forwarded."""

    def __init__(self) -> None:
        self.forwarded: list[bool] = []

    async def handle(self, method: str, path: str, body: bytes, traffic: str = USER,
                     forwarded: bool = False, caller: str = "") -> Response:
        self.forwarded.append(forwarded)
        return Response(200, b"{}")


def test_the_forwarded_mark_counts_only_over_mutual_tls(certs: Path) -> None:
    recorder = Recorder()

    async def test(plain: int, secure: int) -> None:
        assert (await ask(plain, "/v1/chat/completions", CHAT))[0] == 200
        assert (await ask(secure, "/v1/chat/completions", CHAT, client_context(certs)))[0] == 200

    run(certs, recorder, test)
    assert recorder.forwarded == [False, True]  # a plain TCP client is a client


def test_prefill_is_an_unknown_endpoint_but_to_a_member(certs: Path) -> None:
    found, runtimed, _ = gateway(5)

    async def test(plain: int, secure: int) -> None:
        status, answer = await ask(plain, "/v1/syntrop/prefill", CHAT)
        assert status == 404
        error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "unknown_url" and "forwarded" not in error["message"]
        assert not runtimed.fds  # nothing prefilled for it
        status, answer = await ask(secure, "/v1/syntrop/prefill", CHAT, client_context(certs))
        assert status == 200 and answer.endswith(b"\r\n5\r\n\x00\x00\x00\x00\x00\r\n0\r\n\r\n")

    run(certs, found, test)
    assert len(runtimed.fds) == 1 and runtimed.open_states() == 0
    assert found.admission.busy[USER] == 0


def test_a_member_that_stops_reading_the_state_is_cut_off(certs: Path) -> None:
    """The place is held while the state streams; a reader that stops is
    cut off after body_timeout, and the place and the memfd come back."""
    size = 256 << 20  # far more than the sockets buffer
    found, runtimed, config = gateway(size, body_timeout=0.5)

    async def test(plain: int, secure: int) -> None:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", secure, ssl=client_context(certs), server_hostname="127.0.0.1")
        try:
            writer.write(request("/v1/syntrop/prefill", CHAT))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            await asyncio.sleep(0.2)  # streaming, and nobody reading
            assert found.admission.busy[USER] == 1 and runtimed.open_states() == 1
            async with asyncio.timeout(10):
                while found.admission.busy[USER] or runtimed.open_states():
                    await asyncio.sleep(0.05)
            received = 0
            try:
                async with asyncio.timeout(10):
                    while part := await reader.read(1 << 20):
                        received += len(part)
            except (ConnectionError, ssl.SSLError):
                pass
            assert received < size  # cut off, not sent the rest
        finally:
            writer.close()

    run(certs, found, test, config)


def test_a_fleet_is_refused_without_mutual_tls_between_its_members() -> None:
    tls = {"tls_listen": ("127.0.0.1:32443",), "tls_cert": "/c.pem", "tls_key": "/c.key",
           "tls_client_ca": "/ca.pem"}
    member = {"etcd": ("http://e:1",), "node": "a", "peer_cert": "/p.pem",
              "peer_key": "/p.key"}
    check_fleet(Config(listen=()))  # no fleet
    check_fleet(Config(listen=(), fleet=FleetConfig(
        advertise="https://127.0.0.1:32443/v1", **member), **tls))  # type: ignore[arg-type]
    for config in (
            Config(listen=(), fleet=FleetConfig(advertise="http://127.0.0.1:32768/v1",
                                                **member), **tls),  # type: ignore[arg-type]
            Config(listen=(), fleet=FleetConfig(advertise="https://127.0.0.1:32443/v1",
                                                **member)),  # type: ignore[arg-type]
            Config(listen=(), fleet=FleetConfig(etcd=("http://e:1",), node="a",
                                                advertise="https://127.0.0.1:32443/v1"),
                   **tls)):  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="mutual TLS"):
            check_fleet(config)
