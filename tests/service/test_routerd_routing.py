"""routerd's routing under faults and load, for real: socket-activated, in
front of a loopback OpenAI-style upstream (a thread of this test) whose
behaviour per path the test switches.

- memory pressure (a PSI file the test writes, `routing.psi_file`) sends
  local work to the LAN tier, and back when it falls;
- when every candidate is cooling, a request waits for the earliest to
  reopen within its deadline, and gets 503 when none reopens in time;
- triage traffic (x-syntrop-traffic: triage, over the Unix socket: sentry's
  path) passes user traffic queued behind a full house.
"""

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import h11
import pytest
import varlink

from tests.support import activated
from tests.upstreams import send_json, serving

#: name -> "ok" | "fail" | seconds to wait before answering.
BEHAVIOUR: dict[str, Any] = {}
SEEN: list[str] = []


async def _answer(conn: h11.Connection, request: h11.Request, body: bytes,
                  writer: asyncio.StreamWriter) -> bool:
    """/<name>/v1/…: behaves as BEHAVIOUR[name] says, answers its name."""
    name = request.target.decode().split("/")[1]
    SEEN.append(name)
    behaviour = BEHAVIOUR.get(name, "ok")
    if isinstance(behaviour, float):
        await asyncio.sleep(behaviour)
    send_json(conn, writer, {"id": "x", "object": "chat.completion", "created": 0,
                             "model": "m", "choices": [{
                                 "index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": name}}]},
              status=500 if behaviour == "fail" else 200)
    return True


CONFIG = """
[http]
listen = ["127.0.0.1:0", "unix:{unix}"]
[routing]
deadline = 8
psi_threshold = 25
psi_file = "{psi}"
max_inflight = 2
triage_reserved = 1

[[providers]]
id = "local"
kind = "openai"
tier = "local"
endpoint = "http://127.0.0.1:{port}/local/v1"
models = ["m"]

[[providers]]
id = "lan"
kind = "openai"
tier = "lan"
endpoint = "http://127.0.0.1:{port}/lan/v1"
models = ["m"]
weight = 0.5                           # without pressure, local wins whatever the latency

[[providers]]
id = "flaky"
kind = "openai"
tier = "remote"
endpoint = "http://127.0.0.1:{port}/flaky/v1"
models = ["f"]

[[providers]]
id = "sleepy"
kind = "openai"
tier = "remote"
endpoint = "http://127.0.0.1:{port}/sleepy/v1"
models = ["slow"]
"""


class Node:
    def __init__(self, root: Path, stack: ExitStack) -> None:
        port = stack.enter_context(serving(_answer))
        self.psi = root / "memory.pressure"
        self.set_pressure(0.0)
        (root / "config").mkdir(parents=True, exist_ok=True)
        #: The Unix socket: sentry's path, the only one triage is honoured on.
        self.unix = root / "router.sock"
        (root / "config" / "routerd.toml").write_text(CONFIG.format(port=port, psi=self.psi,
                                                                    unix=self.unix))
        daemon = stack.enter_context(activated("routerd", root))
        self.varlink = varlink.Client(address=daemon.address)
        stack.callback(self.varlink.cleanup)
        self.port = next(int(a.rpartition(":")[2]) for a in self.call("GetStatus")["ingress"]
                         if a.startswith("127.0.0.1:"))

    def call(self, method: str, **params: Any) -> Any:
        with self.varlink.open("io.syntrop.Router1") as router:
            return getattr(router, method)(**params)

    def set_pressure(self, some: float) -> None:
        self.psi.write_text(f"some avg10={some:.2f} avg60=0.00 avg300=0.00 total=1\n"
                            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")

    def chat(self, model: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.request("POST", "/v1/chat/completions", body=json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            headers={"content-type": "application/json", **(headers or {})})
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        return response.status, answer

    def triage(self, model: str) -> int:
        """A chat marked as triage over the Unix socket (over TCP the mark
        is ignored): its status."""
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(str(self.unix))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
                         b"x-syntrop-traffic: triage\r\ncontent-type: application/json\r\n"
                         b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body.encode()))
            answer = b""
            while got := sock.recv(65536):
                answer += got
        return int(answer.split(b" ", 2)[1])


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    BEHAVIOUR.clear()
    SEEN.clear()
    with ExitStack() as stack:
        yield Node(tmp_path, stack)


def _content(answer: Any) -> str:
    return str(answer["choices"][0]["message"]["content"])


def test_memory_pressure_offloads_local_work_and_back(node: Node) -> None:
    status, answer = node.chat("m")
    assert (status, _content(answer)) == (200, "local")
    node.set_pressure(60.0)
    deadline = time.monotonic() + 5
    while node.call("Route", model="m")["candidates"][0]["provider"] != "lan":
        assert time.monotonic() < deadline, "pressure never seen"
        time.sleep(0.2)
    status, answer = node.chat("m")
    assert (status, _content(answer)) == (200, "lan")
    assert node.call("GetStatus")["memory_some"] == 60.0
    node.set_pressure(3.0)
    deadline = time.monotonic() + 5
    while node.call("Route", model="m")["candidates"][0]["provider"] != "local":
        assert time.monotonic() < deadline, "pressure never fell"
        time.sleep(0.2)
    assert _content(node.chat("m")[1]) == "local"


def test_all_cooling_waits_for_the_earliest_reopening_within_the_deadline(node: Node) -> None:
    BEHAVIOUR["flaky"] = "fail"
    status, answer = node.chat("f")
    assert (status, answer["error"]["code"]) == (502, "upstream_error")
    BEHAVIOUR["flaky"] = "ok"
    started = time.monotonic()
    status, answer = node.chat("f")        # cooling for 5 s: waits, then probes
    waited = time.monotonic() - started
    assert (status, _content(answer)) == (200, "flaky"), answer
    assert 4.0 <= waited < 8.0, waited
    assert SEEN.count("flaky") == 2


def test_cooling_past_the_deadline_is_a_503(node: Node) -> None:
    BEHAVIOUR["flaky"] = "fail"
    assert node.chat("f")[0] == 502        # open 5 s
    assert node.chat("f")[0] == 502        # waited, probed, failed: open 10 s > deadline 8 s
    started = time.monotonic()
    status, answer = node.chat("f")
    assert (status, answer["error"]["code"]) == (503, "providers_cooling")
    assert time.monotonic() - started < 1.0
    assert SEEN.count("flaky") == 2


def test_triage_passes_queued_user_traffic(node: Node) -> None:
    BEHAVIOUR["sleepy"] = 2.0              # "slow" is answered in 2 s
    results: dict[str, tuple[float, int]] = {}

    def timed(name: str, model: str) -> None:
        started = time.monotonic()
        status = node.triage(model) if name == "triage" else node.chat(model)[0]
        results[name] = (time.monotonic() - started, status)

    # max_inflight 2, one reserved for triage: one slow user request fills
    # the users' share, the next user request queues.
    slow = threading.Thread(target=timed, args=("slow", "slow"))
    slow.start()
    time.sleep(0.3)
    queued = threading.Thread(target=timed, args=("user", "m"))
    queued.start()
    time.sleep(0.3)
    timed("triage", "m")
    slow.join()
    queued.join()
    assert all(status == 200 for _, status in results.values()), results
    assert results["triage"][0] < 1.0, results
    assert results["user"][0] > 1.0, results     # it waited for the slow one
