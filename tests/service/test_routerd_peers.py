"""LAN peers: one routerd reaches another over HTTPS with mutual TLS, from
certificates this test makes with the openssl command. Peer A serves its
HTTPS ingress in front of a loopback upstream; routerd B has A as a "peer"
provider: requests go through, B sees A's health and round-trip time, and
A refuses a client without a certificate."""

import http.client
import json
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import varlink

from tests.fleet import make_certificates
from tests.support import activated
from tests.upstreams import openai_upstream as upstream

NAME = "io.syntrop.Router1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Pair:
    certs: Path
    tls_port: int
    b_port: int
    b: Any


def _ingress_port(address: str) -> int:
    client = varlink.Client(address=address)
    with client.open(NAME) as router:
        ingress = router.GetStatus()["ingress"]
    client.cleanup()
    return next(int(a.rpartition(":")[2]) for a in ingress if a.startswith("127.0.0.1:"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    certs = tmp_path_factory.mktemp("certs")
    make_certificates(certs)
    tls_port = _free_port()
    with ExitStack() as stack:
        port = stack.enter_context(upstream())
        a, b = tmp_path_factory.mktemp("peer-a"), tmp_path_factory.mktemp("peer-b")
        for root in (a, b):
            (root / "config").mkdir(parents=True, exist_ok=True)
        (a / "config" / "routerd.toml").write_text(f"""
[http]
listen = ["127.0.0.1:0"]
tls_listen = ["127.0.0.1:{tls_port}"]
tls_cert = "{certs}/server.pem"
tls_key = "{certs}/server.key"
tls_client_ca = "{certs}/ca.pem"
[[providers]]
id = "upstream"
kind = "openai"
endpoint = "http://127.0.0.1:{port}/good/v1"
models = ["m1"]
""")
        (b / "config" / "routerd.toml").write_text(f"""
[http]
listen = ["127.0.0.1:0"]
[[providers]]
id = "peer-a"
kind = "peer"
endpoint = "https://127.0.0.1:{tls_port}/v1"
tls_ca = "{certs}/ca.pem"
tls_cert = "{certs}/client.pem"
tls_key = "{certs}/client.key"
""")
        daemon_a = stack.enter_context(activated("routerd", a))
        _ingress_port(daemon_a.address)  # A starts (its HTTPS ingress too) on this call
        daemon_b = stack.enter_context(activated("routerd", b))
        client = varlink.Client(address=daemon_b.address)
        stack.callback(client.cleanup)
        with client.open(NAME) as router:
            yield Pair(certs, tls_port, _ingress_port(daemon_b.address), router)


def test_requests_go_through_the_peer_over_mutual_tls(pair: Pair) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", pair.b_port, timeout=20)
    connection.request("POST", "/v1/chat/completions", body=json.dumps(
        {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}),
        headers={"content-type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "good answers"


def test_the_peer_advertises_health_and_round_trip_time(pair: Pair) -> None:
    deadline = time.monotonic() + 10  # asked in the background at start
    while (peer := pair.b.ListProviders()["providers"][0]).get("rtt_ms") is None:
        assert time.monotonic() < deadline, peer
        time.sleep(0.05)
    assert (peer["kind"], peer["tier"]) == ("peer", "lan")
    assert peer["models"][0] == "m1"  # its list, asked over mutual TLS
    assert peer["rtt_ms"] is not None and peer["rtt_ms"] > 0
    # What A advertises (null where the kernel reports no accelerator memory).
    assert peer.get("free_accelerator_bytes") == _peer_health(pair)["free_accelerator_bytes"]


def _peer_health(pair: Pair) -> Any:
    context = ssl.create_default_context(cafile=str(pair.certs / "ca.pem"))
    context.load_cert_chain(str(pair.certs / "client.pem"), str(pair.certs / "client.key"))
    connection = http.client.HTTPSConnection("127.0.0.1", pair.tls_port, timeout=10,
                                             context=context)
    connection.request("GET", "/health")
    response = connection.getresponse()
    assert response.status == 200
    health = json.loads(response.read())
    connection.close()
    return health


def test_a_client_without_a_certificate_is_refused(pair: Pair) -> None:
    context = ssl.create_default_context(cafile=str(pair.certs / "ca.pem"))
    connection = http.client.HTTPSConnection("127.0.0.1", pair.tls_port, timeout=10,
                                             context=context)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        connection.request("GET", "/health")
        connection.getresponse().read()
    connection.close()
    assert _peer_health(pair)["status"] == "ok"  # with one: served
