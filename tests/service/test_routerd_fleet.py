"""A fleet of three routerd nodes on a real three-member etcd cluster
(etcd-server from apt, on loopback ports), each node socket-activated with
its own directories and ports.

Node a has no provider of its own; b and c each serve model "m" from a
loopback OpenAI-style upstream that says who it is and continues a sequence
of numbered words from where an assistant message left it, so a stream
continued on another node shows every word exactly once. Node c reaches etcd
through a TCP relay the test can cut: its partition.

The faults, in order: a node killed mid-stream (the stream continues on the
other, membership drops it within the TTL), one etcd member killed (nothing
changes), quorum lost (the routers keep their members and say degraded,
then recover), a node partitioned from etcd (it says degraded, the others
stop routing to it). `pytest -s` prints the convergence times.
"""

import asyncio
import contextlib
import http.client
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import h11
import pytest
import varlink

from tests.fleet import Cluster, certificates, free_port, tls_fleet, tls_http, wait
from tests.support import Activated, activated
from tests.upstreams import send_json, serving

if shutil.which("etcd") is None:
    pytest.skip("etcd is not installed (package etcd-server: scripts/apt-deps)",
                allow_module_level=True)

ROUTER = "io.syntrop.Router1"
TTL = 3
WORDS = 24
#: Seconds between two streamed words.
PACE = 0.08


class Relay:
    """A TCP relay to one etcd member, which the test can cut (refusing and
    dropping connections) and mend: a node's partition from etcd."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self.cut = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.links: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(5)

    async def _serve(self) -> None:
        self.server = await asyncio.start_server(self._link, "127.0.0.1", self.port)

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut.is_set():
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self.links |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def close(self) -> None:
        """Stop serving, drop every link, and end the loop's thread."""
        async def stop() -> None:
            self.server.close()
            for writer in list(self.links):
                writer.transport.abort()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        while self.loop.is_running():
            time.sleep(0.01)
        self.loop.close()

    def set_cut(self, cut: bool) -> None:
        def apply() -> None:
            if cut:
                self.cut.set()
                for writer in list(self.links):
                    writer.transport.abort()
                self.links.clear()
            else:
                self.cut.clear()
        self.loop.call_soon_threadsafe(apply)


# upstreams -------------------------------------------------------------------


def _said(body: dict[str, Any]) -> int:
    """Words of the sequence an assistant message already holds."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    return len(str(last.get("content", "")).split()) if last.get("role") == "assistant" else 0


def upstream(node: str) -> "contextlib.AbstractContextManager[int]":
    async def answer(conn: h11.Connection, request: h11.Request, body: bytes,
                     writer: asyncio.StreamWriter) -> bool:
        path = request.target.decode()
        if path.endswith("/models"):
            send_json(conn, writer, {"object": "list", "data": [{"id": "m", "object": "model"}]})
            return True
        decoded = json.loads(body)
        start = _said(decoded)
        words = [f"{node}:w{i} " for i in range(start, min(WORDS, start + int(
            decoded.get("max_tokens") or WORDS)))]
        if not decoded.get("stream"):
            send_json(conn, writer, {"id": "x", "object": "chat.completion", "created": 0,
                                     "model": "m", "choices": [{
                                         "index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant",
                                                     "content": "".join(words)}}]})
            return True
        writer.write(conn.send(h11.Response(status_code=200, headers=[
            ("content-type", "text/event-stream")])))
        for index, word in enumerate(words):
            chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": word},
                                  "finish_reason": "stop" if index == len(words) - 1
                                  else None}]}
            writer.write(conn.send(h11.Data(data=f"data: {json.dumps(chunk)}\n\n".encode())))
            await writer.drain()
            await asyncio.sleep(PACE)
        writer.write(conn.send(h11.Data(data=b"data: [DONE]\n\n")) + conn.send(h11.EndOfMessage()))
        return True

    return serving(answer)


# nodes -----------------------------------------------------------------------


class Node:
    def __init__(self, name: str, root: Path, port: int, daemon: Activated) -> None:
        self.name, self.root, self.port, self.daemon = name, root, port, daemon

    def status(self) -> dict[str, Any]:
        with varlink.Client(address=self.daemon.address) as client, \
                client.open(ROUTER) as router:
            return dict(router.GetStatus())

    def chat(self, stream: bool = False, timeout: float = 30) -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        connection.request("POST", "/v1/chat/completions", body=json.dumps(
            {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "go"}]}),
            headers={"content-type": "application/json"})
        response = connection.getresponse()
        raw = response.read().decode()
        connection.close()
        if stream or response.status != 200:
            return response.status, raw
        return response.status, json.loads(raw)["choices"][0]["message"]["content"]

    def kill(self) -> None:
        os.kill(self.daemon.process.pid, signal.SIGKILL)
        self.daemon.process.wait()


def config(name: str, port: int, etcd: list[str], upstream_port: int | None,
           certs: Path) -> str:
    """A node's routerd.toml: its clients' port, and the members' (mutual
    TLS) on another."""
    tls_port = free_port()
    text = "" if upstream_port else "providers = []\n"  # a: none of its own
    text += (f'[http]\nlisten = ["127.0.0.1:{port}"]\n{tls_http(certs, tls_port)}'
             f'[fleet]\netcd = {json.dumps(etcd)}\nnode = "{name}"\nttl = {TTL}\n'
             f'{tls_fleet(certs, tls_port)}publish_interval = 0.2\n')
    if upstream_port:
        text += (f'[[providers]]\nid = "up"\nkind = "openai"\ntier = "local"\n'
                 f'endpoint = "http://127.0.0.1:{upstream_port}/{name}/v1"\nmodels = ["m"]\n')
    return text


def words_of(sse: str) -> list[str]:
    out: list[str] = []
    for line in sse.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                out += (chunk["choices"][0]["delta"].get("content") or "").split()
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Cluster, dict[str, Node], dict[str, Relay]]]:
    cluster = Cluster(tmp_path)
    certs = certificates(tmp_path / "certs")
    with ExitStack() as stack:
        stack.callback(cluster.close)
        cluster.start_all()
        # b and c reach etcd (its first member) through relays the test can
        # cut; a talks to all three members.
        relays = {name: Relay(cluster.client["e1"]) for name in ("b", "c")}
        for relay in relays.values():
            stack.callback(relay.close)
        nodes = {}
        for name in ("a", "b", "c"):
            root = tmp_path / name
            (root / "config").mkdir(parents=True)
            up = stack.enter_context(upstream(name)) if name != "a" else None
            port = free_port()
            etcd = [f"http://127.0.0.1:{relays[name].port}"] if name in relays \
                else cluster.endpoints()
            (root / "config" / "routerd.toml").write_text(config(name, port, etcd, up, certs))
            daemon = stack.enter_context(activated("routerd", root))
            nodes[name] = Node(name, root, port, daemon)
            nodes[name].status()  # started now, not by the first request
        yield cluster, nodes, relays


def test_fleet_membership_and_its_faults(
        fleet: tuple[Cluster, dict[str, Node], dict[str, Relay]]) -> None:
    cluster, nodes, relays = fleet
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    joined = wait("a sees b and c", lambda: a.status()["fleet_members"] == ["b", "c"], 15)
    assert a.status()["fleet"] == "ok" and b.status()["fleet_members"] == ["a", "c"]
    # a has no provider of its own: b or c serves it, and says so.
    served = {a.chat()[1].split(":")[0] for _ in range(6)}
    assert served <= {"b", "c"} and served

    # A node killed mid-stream: the stream goes on on the other node, every
    # word once and in order; membership drops it within the TTL.
    lines: list[str] = []

    def stream() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
        connection.request("POST", "/v1/chat/completions", body=json.dumps(
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}),
            headers={"content-type": "application/json"})
        response = connection.getresponse()
        while line := response.readline():
            lines.append(line.decode())
        connection.close()

    streaming = threading.Thread(target=stream)
    streaming.start()
    wait("a few words", lambda: len(words_of("".join(lines))) >= 5, 15)
    first = words_of("".join(lines))[0].split(":")[0]  # who serves it
    victim, other = (b, c) if first == "b" else (c, b)
    killed_at = time.monotonic()
    victim.kill()
    streaming.join(60)
    result = {"sse": "".join(lines)}
    words = words_of(result["sse"])
    assert [w.split(":")[1] for w in words] == [f"w{i}" for i in range(WORDS)], words
    owners = [w.split(":")[0] for w in words]
    assert owners[0] == victim.name and owners[-1] == other.name  # continued, not restarted
    assert "failed mid-stream; continued on" in result["sse"], result["sse"][:3000]
    dropped = wait(f"a drops {victim.name}",
                   lambda: victim.name not in a.status()["fleet_members"], TTL + 5)
    print(f"\nfleet: joined in {joined:.2f} s; {victim.name} killed -> dropped by a in "
          f"{time.monotonic() - killed_at:.2f} s (TTL {TTL} s)")
    assert dropped <= TTL + 2
    assert a.chat()[1].startswith(f"{other.name}:")
    survivor = other.name

    # One etcd member killed (not the one the relays reach): nothing changes.
    cluster.kill("e2")
    time.sleep(TTL * 2)
    assert a.status()["fleet"] == "ok", (a.status(), (a.root / "log").exists())
    assert a.status()["fleet_members"] == [survivor]
    assert other.status()["fleet"] == "ok" and a.chat()[1].startswith(f"{survivor}:")

    # Quorum lost (two of three gone): routers keep their members, degraded.
    cluster.kill("e3")
    degraded = wait("a says degraded", lambda: a.status()["fleet"] == "degraded", TTL * 4)
    assert a.status()["fleet_members"] == [survivor]
    assert a.chat()[1].startswith(f"{survivor}:")  # still routed to
    cluster.start("e2", "existing")
    cluster.start("e3", "existing")
    recovered = wait("a recovers", lambda: a.status()["fleet"] == "ok", 30)
    wait(f"a still sees {survivor}", lambda: a.status()["fleet_members"] == [survivor], 15)
    print(f"fleet: quorum lost -> degraded in {degraded:.2f} s; back -> ok in "
          f"{recovered:.2f} s")

    # The survivor partitioned from etcd: it says degraded, a stops routing
    # to it; mended, it is back.
    relays[survivor].set_cut(True)
    wait(f"{survivor} says degraded", lambda: other.status()["fleet"] == "degraded", TTL * 4)
    gone = wait(f"a drops {survivor}", lambda: a.status()["fleet_members"] == [], TTL * 4)
    status, body = a.chat()
    assert status == 404 and "model_not_found" in body
    relays[survivor].set_cut(False)
    back = wait(f"{survivor} rejoins", lambda: a.status()["fleet_members"] == [survivor],
                TTL * 4)
    print(f"fleet: {survivor} partitioned -> dropped by a in {gone:.2f} s; mended -> back "
          f"in {back:.2f} s")
