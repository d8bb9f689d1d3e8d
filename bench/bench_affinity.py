#!/usr/bin/env python3
"""Time to first token of a shared-prefix chat workload over three syntrop
nodes: routed by prefix affinity (one node's routerd, the fleet on etcd)
against round-robin over the three nodes (the baseline, same run).

Each node is a whole dev suite (`syn up --dir`, modeld, runtimed with
SmolLM2 and 2 slots, routerd on a port of its own). The workload: PREFIXES
system prompts of about 1.5k tokens each, every request one of them and a
question of its own, in a seeded shuffled order, streamed, 4 tokens. Each
phase starts on fresh nodes and loads the model on each before the clock
runs, so only prefill and routing differ.

- round-robin: request i goes to node i mod 3, whose routerd serves it
  locally (no fleet).
- affinity: every request goes to node a, whose routerd routes it by the
  prefixes the nodes' runtimed report through etcd (and where it sent
  what), to itself or a peer.

    python bench/bench_affinity.py [--requests N] [--prefixes P]

About 5 minutes on 2 cores (a miss is seconds of prefill there). Needs etcd
(scripts/apt-deps) and the SmolLM2 package.
"""

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SYN = [sys.executable, "-m", "syntrop.cli.syn"]
NODES = ("a", "b", "c")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def system_prompt(index: int) -> str:
    """About 1.5k tokens of SmolLM2's vocabulary, different per index."""
    topics = ("rivers", "mountains", "forests", "deserts", "oceans", "islands", "lakes",
              "valleys", "glaciers", "canyons")
    topic = topics[index % len(topics)]
    return f"You are a guide to {topic} (set {index}). " + " ".join(
        f"Rule {i}: keep answers about {topic} {['calm', 'quick', 'safe', 'small'][i % 4]} "
        "and sourced." for i in range(125))


@contextlib.contextmanager
def etcd(root: Path) -> Iterator[str]:
    client, peer = free_port(), free_port()
    log = open(root / "etcd.log", "ab")  # noqa: SIM115 - the child's
    process = subprocess.Popen(
        ["etcd", "--name", "e1", "--data-dir", str(root / "etcd"),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"e1=http://127.0.0.1:{peer}"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    url = f"http://127.0.0.1:{client}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=1).json()["health"] == "true")
        yield url
    finally:
        process.kill()
        process.wait()


def wait_for(check: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        if time.monotonic() > deadline:
            raise SystemExit("bench_affinity: a node did not come up in time")
        time.sleep(0.2)


@contextlib.contextmanager
def nodes(root: Path, fleet: str | None) -> Iterator[dict[str, int]]:
    """Three dev suites; their HTTP ports by node."""
    ports = {name: free_port() for name in NODES}
    started = []
    try:
        for name, port in ports.items():
            directory = root / name
            (directory / "config").mkdir(parents=True)
            text = f'[http]\nlisten = ["127.0.0.1:{port}"]\n'
            if fleet:
                text += (f'[fleet]\netcd = ["{fleet}"]\nnode = "{name}"\n'
                         f'advertise = "http://127.0.0.1:{port}/v1"\nttl = 5\n')
            (directory / "config" / "routerd.toml").write_text(text)
            (directory / "config" / "runtimed.toml").write_text("[runtimed]\nslots = 2\n")
            subprocess.run([*SYN, "up", "--dir", str(directory), "--idle-timeout", "900"],
                           check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
            started.append(directory)
        for port in ports.values():  # the model loaded on every node
            def answered(port: int = port) -> tuple[float, str]:
                return ask(port, [{"role": "user", "content": "Hi"}])
            wait_for(answered)
        if fleet:
            wait_for(lambda: all(len(members(d)) == 2 for d in started))
        yield ports
    finally:
        for directory in started:
            subprocess.run([*SYN, "down", "--dir", str(directory)], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


def members(directory: Path) -> list[str]:
    """The fleet members a node's routerd knows (Router1.GetStatus)."""
    import varlink

    address = f"unix:{directory}/run/io.syntrop.Router1"
    with varlink.Client(address=address) as client, \
            client.open("io.syntrop.Router1") as router:
        return list(router.GetStatus()["fleet_members"])


def ask(port: int, messages: list[dict[str, str]]) -> tuple[float, str]:
    """Seconds to the first content of a streamed chat (read to its end),
    and the provider that served it (routerd's x-syntrop-provider)."""
    started = time.perf_counter()
    body = {"model": "smollm2", "max_tokens": 4, "temperature": 0, "stream": True,
            "messages": messages}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                      timeout=120) as response:
        response.raise_for_status()
        first = None
        for line in response.iter_lines():  # to the end, as clients read
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the stream ended without content")
    return first, response.headers.get("x-syntrop-provider", "?")


def workload(requests: int, prefixes: int) -> list[list[dict[str, str]]]:
    rng = random.Random(7)
    order = [i % prefixes for i in range(requests)]
    rng.shuffle(order)
    return [[{"role": "system", "content": system_prompt(p)},
             {"role": "user", "content": f"Question {n}: which one is the oldest?"}]
            for n, p in enumerate(order)]


def phase(root: Path, chats: list[list[dict[str, str]]], affinity: bool,
          trace: bool) -> list[float]:
    samples = []
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(etcd(root)) if affinity else None
        ports = stack.enter_context(nodes(root, fleet))
        for i, chat in enumerate(chats):
            node = "a" if affinity else NODES[i % len(NODES)]
            seconds, provider = ask(ports[node], chat)
            samples.append(seconds)
            if trace:
                print(f"  {'affinity' if affinity else 'round-robin'} {i:3d} "
                      f"{chat[0]['content'][:40]!r}... node {node} -> {provider}: "
                      f"{seconds:.3f} s", file=sys.stderr)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"mean": statistics.fmean(ordered), "p50": ordered[len(ordered) // 2],
            "p90": ordered[int(len(ordered) * 0.9)],
            "hits": sum(1 for s in ordered if s < 1.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--prefixes", type=int, default=6)
    parser.add_argument("--trace", action="store_true",
                        help="print each request's node, provider and TTFT")
    args = parser.parse_args()
    if shutil.which("etcd") is None:
        raise SystemExit("bench_affinity: etcd is not installed (scripts/apt-deps)")
    chats = workload(args.requests, args.prefixes)
    results = {}
    for name, affinity in (("round-robin", False), ("affinity", True)):
        with tempfile.TemporaryDirectory(prefix=f"syntrop-affinity-{name}-") as scratch:
            results[name] = summary(phase(Path(scratch), chats, affinity, args.trace))
    base, ours = results["round-robin"], results["affinity"]
    print(f"{args.requests} requests, {args.prefixes} prefixes of ~1.5k tokens, 3 nodes x 2 "
          f"slots, load {os.getloadavg()[0]:.2f}")
    print(f"{'routing':<12} {'mean s':>8} {'p50 s':>8} {'p90 s':>8} {'hits':>6}")
    for name, row in results.items():
        print(f"{name:<12} {row['mean']:8.3f} {row['p50']:8.3f} {row['p90']:8.3f} "
              f"{int(row['hits']):6d}")
    print(f"affinity / round-robin mean TTFT: {ours['mean'] / base['mean']:.3f} "
          f"({base['mean'] / ours['mean']:.1f}x faster)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
