"""The ingress's own rules: which Host values name this routerd, which
POST bodies are taken, and who may claim triage's reserved places. Pure
functions, and a real listener on loopback and a Unix socket with a
gateway that only records what it was asked."""

import asyncio
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest

from syntrop.config import ConfigError
from syntrop.routerd.api import Response
from syntrop.routerd.config import Config
from syntrop.routerd.http import HTTPServer, host_allowed, unsupported_body
from syntrop.routerd.queues import TRIAGE, USER
from syntrop.routerd.request import read

BOUND = frozenset({"127.0.0.1:32768", "[::1]:32768"})


@pytest.mark.parametrize("host", [
    b"127.0.0.1:32768", b"[::1]:32768", b"localhost", b"localhost:32768", b"LocalHost:9",
    b"127.0.0.1", b"[::1]", b"[::1]:80", b" 127.0.0.1:32768 "])
def test_loopback_and_bound_hosts_pass(host: bytes) -> None:
    assert host_allowed(host, BOUND, ())


@pytest.mark.parametrize("host", [
    None, b"", b"evil.example", b"evil.example:32768", b"localhost.evil.example",
    b"127.0.0.1.evil.example", b"10.0.0.7:32768", b"localhost:x", b"[::1]x",
    b"[::1]:32768:1", b"0.0.0.0:32768", b":32768", b"user@localhost"])
def test_other_hosts_are_refused(host: bytes | None) -> None:
    assert not host_allowed(host, BOUND, ())


def test_a_wildcard_listen_passes_the_address_the_connection_came_to() -> None:
    # Bound to 0.0.0.0:32768, a connection to 10.0.0.7 has that local address.
    local = frozenset({"0.0.0.0:32768", "10.0.0.7:32768"})
    assert host_allowed(b"10.0.0.7:32768", local, ())
    assert not host_allowed(b"10.0.0.8:32768", local, ())
    assert not host_allowed(b"10.0.0.7:1", local, ())


def test_configured_names_pass_at_any_port_or_the_one_named() -> None:
    allowed = ("box.lan", "router.lan:8080")
    assert host_allowed(b"box.lan", BOUND, allowed)
    assert host_allowed(b"BOX.lan:32768", BOUND, allowed)
    assert host_allowed(b"router.lan:8080", BOUND, allowed)
    assert not host_allowed(b"router.lan:8081", BOUND, allowed)
    assert not host_allowed(b"router.lan", BOUND, allowed)
    assert not host_allowed(b"other.lan", BOUND, allowed)


def test_a_post_body_must_be_declared_json() -> None:
    assert unsupported_body(b"application/json") is None
    assert unsupported_body(b"Application/JSON; charset=utf-8") is None
    for kind in (None, b"text/plain", b"application/x-www-form-urlencoded",
                 b"multipart/form-data; boundary=x", b""):
        refused = unsupported_body(kind)
        assert refused is not None and refused.status == 415
        assert json.loads(refused.body)["error"]["code"] == "unsupported_media_type"


class Recorder:
    """A gateway that answers 200 and remembers each request's traffic."""

    def __init__(self) -> None:
        self.traffic: list[str] = []

    async def handle(self, method: str, path: str, body: bytes, traffic: str = USER,
                     forwarded: bool = False, caller: str = "") -> Response:
        self.traffic.append(traffic)
        return Response(200, b"{}")


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               head: bytes) -> bytes:
    writer.write(head)
    await writer.drain()
    answer = await reader.read(65536)
    writer.close()
    return answer


TRIAGE_POST = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
               b"x-syntrop-traffic: triage\r\ncontent-type: application/json\r\n"
               b"content-length: 2\r\nconnection: close\r\n\r\n{}")


def test_triage_is_honoured_over_the_unix_socket_only() -> None:
    async def run(path: str) -> list[str]:
        gateway = Recorder()
        server = HTTPServer(gateway, Config(listen=()))  # type: ignore[arg-type]
        await server.start(("127.0.0.1:0", f"unix:{path}"))
        port = int(server.addresses[0].rpartition(":")[2])
        try:
            tcp = await _ask(*await asyncio.open_connection("127.0.0.1", port), TRIAGE_POST)
            unix = await _ask(*await asyncio.open_unix_connection(path), TRIAGE_POST)
        finally:
            await server.close()
        assert tcp.startswith(b"HTTP/1.1 200") and unix.startswith(b"HTTP/1.1 200")
        return gateway.traffic

    with tempfile.TemporaryDirectory() as directory:
        assert asyncio.run(run(str(Path(directory) / "router.sock"))) == [USER, TRIAGE]


def test_over_the_unix_socket_host_and_an_undeclared_body_are_not_asked() -> None:
    async def run(path: str) -> bytes:
        server = HTTPServer(Recorder(), Config(listen=()))  # type: ignore[arg-type]
        await server.start((f"unix:{path}",))
        try:
            return await _ask(*await asyncio.open_unix_connection(path),
                              b"POST /v1/chat/completions HTTP/1.1\r\nhost: anything\r\n"
                              b"content-length: 2\r\nconnection: close\r\n\r\n{}")
        finally:
            await server.close()

    with tempfile.TemporaryDirectory() as directory:
        assert asyncio.run(run(str(Path(directory) / "s"))).startswith(b"HTTP/1.1 200")


def test_an_activated_socket_beyond_loopback_without_keys_is_refused() -> None:
    async def run(sock: socket.socket, config: Config) -> None:
        server = HTTPServer(Recorder(), config)  # type: ignore[arg-type]
        try:
            await server.adopt([sock])
        finally:
            await server.close()

    # Never connected to: its address is only read.
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        with pytest.raises(ConfigError, match="api_keys_file"):
            asyncio.run(run(sock, Config(listen=())))
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        asyncio.run(run(sock, Config(listen=(), api_keys=frozenset({"sk-one"}))))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        asyncio.run(run(sock, Config(listen=())))


class Fleet:
    """A node's gateway as its peers reach it: answers a chat, a prefill
    and /health, and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, bool]] = []

    async def handle(self, method: str, path: str, body: bytes, traffic: str = USER,
                     forwarded: bool = False, caller: str = "") -> Response:
        self.asked.append((method, path, forwarded))
        if path == "/health":
            return Response(200, b'{"status": "ok"}')
        if path == "/v1/syntrop/prefill":
            return Response(200, b"state")
        return Response(200, b'{"choices": []}')


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost"])
def test_a_peer_over_plain_tcp_is_served_not_refused(name: str) -> None:
    """What routerd sends a fleet member over plain HTTP (its advertised
    endpoint) passes that member's Host and JSON checks: no 421, no 415;
    it is a client's there, its x-syntrop-forwarded ignored (test_members)."""
    from syntrop.routerd.config import ProviderConfig
    from syntrop.routerd.providers.peer import PeerProvider

    async def run() -> list[tuple[str, str, bool]]:
        gateway = Fleet()
        server = HTTPServer(gateway, Config(listen=()))  # type: ignore[arg-type]
        await server.start(("127.0.0.1:0",))
        port = int(server.addresses[0].rpartition(":")[2])
        peer = PeerProvider(ProviderConfig(id="fleet:b", kind="peer", tier="lan",
                                           endpoint=f"http://{name}:{port}/v1", timeout=10))
        try:
            await peer.advertise()
            asked = read("chat/completions",
                         b'{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}')
            assert await peer.complete(asked)
            fd = await peer.prefill(asked)
            try:
                # a pipe the state is copied into as it comes (runtimed reads it)
                assert await asyncio.to_thread(os.read, fd, 16) == b"state"
            finally:
                os.close(fd)
        finally:
            for _, writer in peer.idle:
                writer.close()
            await server.close()
        return gateway.asked

    assert asyncio.run(run()) == [("GET", "/health", False),
                                  ("POST", "/v1/chat/completions", False),
                                  ("POST", "/v1/syntrop/prefill", False)]
