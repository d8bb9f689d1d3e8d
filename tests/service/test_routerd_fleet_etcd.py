"""A fleet of three routerd nodes on a real three-member etcd cluster, every
node configured with every member, the same one first: killing that member
is invisible. Every node's Router1.GetStatus is polled at 25 Hz from before
the kill until a whole lease TTL after it, and never says degraded; members
stay members and requests keep being routed (fleet.py, etcd.py)."""

import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import varlink

from tests.fleet import Cluster, certificates, free_port, tls_fleet, tls_http, wait
from tests.service.test_routerd_fleet import ROUTER, Node, upstream
from tests.support import activated

if shutil.which("etcd") is None:
    pytest.skip("etcd is not installed (package etcd-server: scripts/apt-deps)",
                allow_module_level=True)

#: A third of it (3 s) is more than a leader election of this cluster takes
#: (election timeout 1 s, randomized up to twice that): the member killed
#: may be the leader.
TTL = 9
#: Seconds between two looks at a node's status (25 Hz).
POLL = 0.04


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Cluster, dict[str, Node]]]:
    cluster = Cluster(tmp_path)
    certs = certificates(tmp_path / "certs")
    with ExitStack() as stack:
        stack.callback(cluster.close)
        cluster.start_all()
        nodes = {}
        for name in ("a", "b", "c"):
            root = tmp_path / name
            (root / "config").mkdir(parents=True)
            up = stack.enter_context(upstream(name)) if name != "a" else None
            port, tls_port = free_port(), free_port()
            text = "" if up else "providers = []\n"
            text += (f'[http]\nlisten = ["127.0.0.1:{port}"]\n{tls_http(certs, tls_port)}'
                     f'[fleet]\netcd = {json.dumps(cluster.endpoints())}\nnode = "{name}"\n'
                     f'ttl = {TTL}\n{tls_fleet(certs, tls_port)}'
                     'publish_interval = 0.2\n')
            if up:
                text += (f'[[providers]]\nid = "up"\nkind = "openai"\ntier = "local"\n'
                         f'endpoint = "http://127.0.0.1:{up}/{name}/v1"\nmodels = ["m"]\n')
            (root / "config" / "routerd.toml").write_text(text)
            daemon = stack.enter_context(activated("routerd", root))
            nodes[name] = Node(name, root, port, daemon)
            nodes[name].status()  # started now, not by the first request
        yield cluster, nodes


class Watcher(threading.Thread):
    """Polls one node's Router1.GetStatus at 25 Hz until stopped: every
    (fleet state, members) it saw."""

    def __init__(self, node: Node) -> None:
        super().__init__(daemon=True)
        self.node, self.stop = node, threading.Event()
        self.seen: list[tuple[str, tuple[str, ...]]] = []

    def run(self) -> None:
        with varlink.Client(address=self.node.daemon.address) as client, \
                client.open(ROUTER) as router:
            while not self.stop.wait(POLL):
                status = router.GetStatus()
                self.seen.append((status["fleet"], tuple(status["fleet_members"])))


def test_losing_the_first_etcd_member_is_invisible(
        fleet: tuple[Cluster, dict[str, Node]]) -> None:
    cluster, nodes = fleet
    everyone = sorted(nodes)
    for node in nodes.values():
        others = [n for n in everyone if n != node.name]
        wait(f"{node.name} sees the others",
             lambda node=node, others=others: node.status()["fleet_members"] == others
             and node.status()["fleet"] == "ok", 20)
    watchers = [Watcher(node) for node in nodes.values()]
    for watcher in watchers:
        watcher.start()
    wait("every watcher has looked", lambda: all(w.seen for w in watchers), 10)
    served: list[tuple[int, str]] = []
    killed_at = time.monotonic()
    cluster.kill("e1")  # the endpoint every node lists first
    # A whole lease TTL: each node renews its lease at least twice through
    # another member (else its key is gone and the others drop it), and
    # anything that fails has had ttl/3 to turn into `degraded`.
    while time.monotonic() - killed_at < TTL:
        served.append(nodes["a"].chat(timeout=10))
    for watcher in watchers:
        watcher.stop.set()
        watcher.join(10)
    for watcher in watchers:
        states = {state for state, _ in watcher.seen}
        members = {m for _, m in watcher.seen}
        rest = tuple(n for n in everyone if n != watcher.node.name)
        looks = len(watcher.seen)
        print(f"\n  {watcher.node.name}: {looks} looks in {TTL} s+, states {states}")
        assert states == {"ok"}, (watcher.node.name, watcher.seen)
        assert members == {rest}, (watcher.node.name, members)
    # Routing went on: a (no provider of its own) kept reaching b or c.
    assert served and all(status == 200 and text.split(":")[0] in ("b", "c")
                          for status, text in served), served
    assert all(node.status()["fleet"] == "ok" for node in nodes.values())
