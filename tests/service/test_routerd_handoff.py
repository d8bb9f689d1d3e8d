"""The prefill hand-off through routerd on a fleet of two real syntrop
nodes (modeld, runtimed with SmolLM2 and two slots, routerd each; one etcd
cluster). A long chat enters the idle node; its home is the other node,
which is decoding a long stream: the idle node's runtimed prefills it
(POST /v1/syntrop/prefill on the idle node), the home pulls the state and
answers from it. The answer is the same greedy text as the home prefilling
it itself, and the home computed only the prompt's last token."""

import contextlib
import http.client
import json
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import varlink

from syntrop.prefix import chain
from syntrop.routerd.request import turns
from syntrop.routerd.scoring import homes
from tests.fleet import (
    Cluster,
    certificates,
    free_port,
    member_connection,
    records,
    tls_fleet,
    tls_http,
    wait,
)
from tests.models import model_node, require_llama
from tests.support import Activated, activated

require_llama()
if shutil.which("etcd") is None:
    pytest.skip("etcd is not installed (package etcd-server: scripts/apt-deps)",
                allow_module_level=True)

NODES = ("a", "b")
#: A node's mutual-TLS listener, as a member reaches it: (certificates, port).
Member = tuple[Path, int]
Fleet = tuple[Cluster, dict[str, int], dict[str, Activated], dict[str, Member],
              dict[str, Activated], "MemoryCap"]
#: routerd's MemoryMax (units/routerd.service).
ROUTERD_MEMORY = 32 << 20
#: Bytes of a SmolLM2-135M state per token: 30 layers' keys and values, 3
#: KV heads of 64 in f16.
STATE_PER_TOKEN = 30 * 2 * 3 * 64 * 2


class MemoryCap:
    """A child of this test's memory cgroup limited to `limit` bytes (no
    swap), as routerd's unit runs it; `usable` False where none can be made
    here (not root, no memory controller: the test runs uncapped)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        own = next((line.split(":", 2)[2]
                    for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if line.split(":", 2)[1] in ("memory", "")), "/")
        v1 = Path("/sys/fs/cgroup/memory") / own.lstrip("/")
        self.v1 = v1.is_dir()
        self.parent = v1 if self.v1 else Path("/sys/fs/cgroup") / own.lstrip("/")
        self.group = self.parent / f"routerd-test-{os.getpid()}"
        try:
            self.group.mkdir()
            if self.v1:
                (self.group / "memory.limit_in_bytes").write_text(str(limit))
            else:
                (self.group / "memory.max").write_text(str(limit))
                (self.group / "memory.swap.max").write_text("0")
            self.usable = True
        except OSError:
            with contextlib.suppress(OSError):
                self.group.rmdir()
            self.usable = False

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """This process in the group meanwhile: what it starts stays there."""
        if not self.usable:
            yield
            return
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (self.parent / "cgroup.procs").write_text(str(os.getpid()))

    def said(self) -> dict[str, int]:
        """The group's peak usage and OOM kills (empty when not usable)."""
        if not self.usable:
            return {}
        if self.v1:
            oom = (self.group / "memory.oom_control").read_text().split()
            return {"peak": int((self.group / "memory.max_usage_in_bytes").read_text()),
                    "oom_kills": int(oom[oom.index("oom_kill") + 1])}
        events = (self.group / "memory.events").read_text().split()
        return {"peak": int((self.group / "memory.peak").read_text()),
                "oom_kills": int(events[events.index("oom_kill") + 1])}

    def close(self) -> None:
        """The group removed once what it held has ended."""
        if self.usable:
            with contextlib.suppress(OSError):
                for pid in (self.group / "cgroup.procs").read_text().split():
                    (self.parent / "cgroup.procs").write_text(pid)
                self.group.rmdir()


def long_chat() -> dict[str, Any]:
    """About 2,300 prompt tokens, answered greedily."""
    rules = " ".join(f"Rule {i}: answers about rivers stay short, calm and sourced."
                     for i in range(160))
    return {"model": "smollm2", "max_tokens": 24, "temperature": 0, "messages": [
        {"role": "system", "content": f"You are a guide to rivers. {rules}"},
        {"role": "user", "content": "Name one famous river."}]}


#: The node routing sends long_chat to (its prefix's home).
HOME = homes(chain(turns(long_chat()) or [])[0][0], NODES)[0]


def connect(port: int, member: Member | None) -> http.client.HTTPConnection:
    """A client's connection to the node at `port`, or (`member`: its
    mutual-TLS listener) a member's, whose forwarded requests it serves."""
    if member is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    return member_connection(*member, timeout=300)


def post(port: int, body: dict[str, Any],
         member: Member | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The answer and its headers; `member`: forwarded, served by that node."""
    connection = connect(port, member)
    try:
        connection.request("POST", "/v1/chat/completions", body=json.dumps(body),
                           headers={"content-type": "application/json",
                                    **({"x-syntrop-forwarded": "1"} if member else {})})
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200, answer
        return answer, {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()


class Busy:
    """A long completion streaming on one node's own runtimed (forwarded
    by a member: served there), read until `stop`."""

    def __init__(self, member: Member) -> None:
        self.connection = connect(0, member)
        self.connection.request(
            "POST", "/v1/completions",
            headers={"content-type": "application/json", "x-syntrop-forwarded": "1"},
            body=json.dumps({"model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 3000,
                             "temperature": 0, "stream": True}))
        self.response = self.connection.getresponse()
        assert self.response.status == 200
        self.response.readline()  # streaming now
        self.done = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            while not self.done.is_set() and self.response.readline():
                pass
        except (OSError, AttributeError, ValueError):  # closed under it: stopped
            pass

    def stop(self) -> None:
        self.done.set()
        self.connection.close()  # routerd cancels it in runtimed
        self.reader.join(10)


def free_slots(cluster: Cluster, node: str) -> int | None:
    record = records(cluster.endpoints()[0]).get(node) or {}
    free = record.get("free_slots")
    return free if isinstance(free, int) else None


def unloaded(runtimed: Activated) -> bool:
    """Whether the model could be unloaded (no stream running on it)."""
    with varlink.Client(address=runtimed.address) as client, \
            client.open("io.syntrop.Runtime1") as runtime:
        return "smollm2" in runtime.Unload(model="smollm2")["unloaded"]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    cluster = Cluster(tmp_path)
    certs = certificates(tmp_path / "certs")
    with ExitStack() as stack:
        stack.callback(cluster.close)
        cluster.start_all()
        ports, runtimes, members, routers = {}, {}, {}, {}
        cap = MemoryCap(ROUTERD_MEMORY)
        stack.callback(cap.close)
        for name in NODES:
            root = tmp_path / name
            (root / "config").mkdir(parents=True)
            ports[name], tls_port = free_port(), free_port()
            members[name] = (certs, tls_port)
            (root / "config" / "runtimed.toml").write_text(
                "[runtimed]\nslots = 2\nn_ctx = 4096\n")
            (root / "config" / "routerd.toml").write_text(
                f'[http]\nlisten = ["127.0.0.1:{ports[name]}"]\n{tls_http(certs, tls_port)}'
                f'[fleet]\netcd = {json.dumps(cluster.endpoints())}\nnode = "{name}"\n'
                f'ttl = 3\n{tls_fleet(certs, tls_port)}'
                "handoff_tokens = 1024\n")
            runtimes[name] = stack.enter_context(model_node(root, stack))
            # The chat's home pulls the state: its routerd starts capped.
            with cap.entered() if name == HOME else contextlib.nullcontext():
                router = routers[name] = stack.enter_context(activated("routerd", root))
            with varlink.Client(address=router.address) as client, \
                    client.open("io.syntrop.Router1") as proxy:
                proxy.GetStatus()  # routerd started, its HTTP listener open
            post(ports[name], {"model": "smollm2", "max_tokens": 1, "messages": [
                {"role": "user", "content": "Hi"}]})  # the model loaded, not in the test
        wait("both nodes publish their load", lambda: all(
            free_slots(cluster, n) == 2 for n in NODES), 30)
        yield cluster, ports, runtimes, members, routers, cap


def test_a_busy_home_answers_from_an_idle_nodes_prefill(fleet: Fleet) -> None:
    """The home's routerd runs under its unit's MemoryMax (32M) and pulls a
    state larger than that: it copies the state into runtimed's pipe as it
    comes, holding none of it, and is not OOM-killed."""
    cluster, ports, runtimes, members, routers, cap = fleet
    body = long_chat()
    home, idle = HOME, next(n for n in NODES if n != HOME)
    busy = Busy(members[home])
    try:
        wait("the home publishes its busy slot", lambda: free_slots(cluster, home) == 1, 15)
        handed, headers = post(ports[idle], body)
    finally:
        busy.stop()
    memory = cap.said()
    print(f"the home's routerd, started under a {ROUTERD_MEMORY >> 20} MiB cap: {memory}")
    assert routers[home].process.poll() is None, "the home's routerd died"
    assert not memory.get("oom_kills"), memory
    assert headers.get("x-syntrop-handoff") == idle, headers
    assert headers.get("x-syntrop-provider") == f"fleet:{home}", headers
    usage = handed["usage"]
    # The home evaluated the last prompt token only: the rest was handed.
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert usage["prompt_tokens"] > 2048
    assert usage["prompt_tokens"] * STATE_PER_TOKEN > ROUTERD_MEMORY  # more than the cap

    # The same chat prefilled at the home (forwarded: served there), once
    # the stream has stopped and nothing is resident there.
    wait("the home's runtimed is idle", lambda: unloaded(runtimes[home]), 30)
    prefilled, headers = post(ports[home], body, member=members[home])
    assert "x-syntrop-handoff" not in headers
    assert prefilled["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    text = prefilled["choices"][0]["message"]["content"]
    assert handed["choices"][0]["message"]["content"] == text and text.strip()
