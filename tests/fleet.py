"""A real etcd cluster for fleet tests: members on loopback ports, each
etcd-server from apt, killed and restarted by name; and the helpers the
fleet tests share: members reach each other over mutual TLS (`Certificates`),
the only way one routerd takes another's forwarded requests."""

import http.client
import json
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# etcd ------------------------------------------------------------------------


class Cluster:
    """Three etcd members on loopback; kill and restart them by name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names = ("e1", "e2", "e3")
        self.client = {n: free_port() for n in self.names}
        self.peer = {n: free_port() for n in self.names}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{self.client[n]}" for n in self.names]

    def start(self, name: str, state: str = "new") -> None:
        cluster = ",".join(f"{n}=http://127.0.0.1:{self.peer[n]}" for n in self.names)
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the child's
        self.processes[name] = subprocess.Popen(
            ["etcd", "--name", name, "--data-dir", str(self.root / name),
             "--listen-client-urls", f"http://127.0.0.1:{self.client[name]}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.client[name]}",
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer[name]}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer[name]}",
             "--initial-cluster", cluster, "--initial-cluster-state", state,
             "--heartbeat-interval", "100", "--election-timeout", "1000"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    def start_all(self) -> None:
        """Every member, and wait until each says it is healthy."""
        for name in self.names:
            self.start(name)
        wait("etcd healthy", lambda: all(self.healthy(n) for n in self.names), 30)

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.kill()
        process.wait()

    def healthy(self, name: str) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.client[name], timeout=1)
        try:
            connection.request("GET", "/health")
            return bool(json.loads(connection.getresponse().read()).get("health") == "true")
        except (OSError, ValueError):
            return False
        finally:
            connection.close()

    def close(self) -> None:
        for name in list(self.processes):
            self.kill(name)


def wait(what: str, probe: Any, timeout: float) -> float:
    """Seconds until `probe()` is true; fails after `timeout`."""
    started = time.monotonic()
    while not probe():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - started


def records(endpoint: str, prefix: str = "/syntrop/fleet/nodes/") -> dict[str, Any]:
    """The fleet's records in etcd, by node, read through etcd's JSON
    gateway (what routerd publishes, as any client sees it)."""
    import base64

    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                       "range_end": base64.b64encode(end.encode()).decode()})
    host, _, port = endpoint.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request("POST", "/v3/kv/range", body=body,
                           headers={"content-type": "application/json"})
        found = json.loads(connection.getresponse().read()).get("kvs", [])
    finally:
        connection.close()
    return {base64.b64decode(kv["key"]).decode().rpartition("/")[2]:
            json.loads(base64.b64decode(kv["value"])) for kv in found}


# mutual TLS ------------------------------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certificates(where: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", str(where / "ca.key"), "-out",
             str(where / "ca.pem"), "-subj", "/CN=syntrop test CA", "-days", "2",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, extensions in (
            ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
            ("client", "extendedKeyUsage=clientAuth\n")):
        (where / f"{name}.ext").write_text(extensions)
        _openssl("req", *ec, "-keyout", str(where / f"{name}.key"), "-out",
                 str(where / f"{name}.csr"), "-subj", f"/CN=routerd {name}")
        _openssl("x509", "-req", "-in", str(where / f"{name}.csr"), "-CA", str(where / "ca.pem"),
                 "-CAkey", str(where / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-out", str(where / f"{name}.pem"), "-extfile", str(where / f"{name}.ext"))


def certificates(where: Path) -> Path:
    """`where`, holding make_certificates' files: every node of a test
    fleet serves server.pem and reaches the others with client.pem."""
    import shutil

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    where.mkdir(parents=True, exist_ok=True)
    make_certificates(where)
    return where


def tls_http(certs: Path, tls_port: int) -> str:
    """A node's [http] lines for the mutual-TLS listener members reach it on."""
    return (f'tls_listen = ["127.0.0.1:{tls_port}"]\ntls_cert = "{certs}/server.pem"\n'
            f'tls_key = "{certs}/server.key"\ntls_client_ca = "{certs}/ca.pem"\n')


def tls_fleet(certs: Path, tls_port: int) -> str:
    """A node's [fleet] lines: advertised at that listener, and the client
    certificate it reaches the other members with."""
    return (f'advertise = "https://127.0.0.1:{tls_port}/v1"\npeer_ca = "{certs}/ca.pem"\n'
            f'peer_cert = "{certs}/client.pem"\npeer_key = "{certs}/client.key"\n')


def member_connection(certs: Path, tls_port: int, timeout: float) -> http.client.HTTPConnection:
    """A connection to a node's mutual-TLS listener as a member opens it:
    what it sends marked x-syntrop-forwarded is served there."""
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
    return http.client.HTTPSConnection("127.0.0.1", tls_port, timeout=timeout, context=context)
