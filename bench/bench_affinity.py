#!/usr/bin/env python3
"""Time to first token and throughput of a shared-prefix chat workload over
three syntrop nodes, three ways in the same run: routed by prefix affinity
(the fleet on etcd, random entry nodes), round-robin over the three nodes
(the baseline), and an oracle that reads every node's cache before each
request (the ceiling affinity is measured against).

Each node is a whole dev suite (`syn up --dir`, modeld, runtimed with
SmolLM2 and 2 slots, routerd on a port of its own). The workload: PREFIXES
users, each with a system prompt of about 1.5k tokens of its own; every
request one user's prompt and a question of its own, in a seeded shuffled
order, streamed, 4 tokens. Each phase starts on fresh nodes and loads the
model on each before the clock runs, so only prefill and routing differ.

- affinity: request i enters through a node drawn at random (from --seed,
  like the requests' order), whose routerd routes it by the
  prefixes the nodes' runtimed report through etcd (and where it sent
  what), to itself or a peer.
- round-robin: request i goes to node i mod 3, whose routerd serves it
  locally (no fleet).
- oracle: no fleet. Before each request the bench waits until no node is
  running a request, reads every node's runtimed cache (Runtime1.GetLoad:
  the prefix digests its idle contexts hold), computes the request's digest
  chain with syntrop's own functions (syntrop.prefix.chain over the turns
  routerd would send, syntrop.routerd.providers.runtimed.turns) and sends it
  straight to the node holding its longest prefix (syntrop.prefix.matched),
  else to the node with the fewest cached contexts (the most room). Its
  look-ups are outside its TTFT but inside its phase's wall time.

A hit is measured, not guessed: every request asks for stream_options
include_usage, and routerd's last chunk carries runtimed's
usage.prompt_tokens_details.cached_tokens (tokens whose KV a context
already held). A request is a hit when those cover the system prompt: at
least prompt_tokens less a bound on the user turn's tokens (its characters,
plus 16 for the chat template). Only a response without that field (none is
expected from runtimed's default layout) falls back to a TTFT under 1 s,
and the output counts how many did.

Throughput is requests per second over each phase's sequential run (one
client, each request read to its end; requests / wall seconds from the
first request to the last answer), not a concurrent load test.

Acceptance: round-robin's TTFT p50 at least 5x affinity's; affinity's hits
at least 90% of the oracle's.

Then the prefill hand-off (docs/routerd.md): three fresh nodes, node a on
CPU 0 and b and c on CPU 1 (one host standing in for machines), node a
decoding a long completion; pairs of ~2.3k-token chats whose home is a, one
entered at b (routed to a, prefilled by an idle member and handed to a),
one sent straight to a (prefilled there beside its stream: the floor),
interleaved, fresh prompts each time. Greedy answers, 4 tokens, TTFT.

    python bench/bench_affinity.py [--requests N] [--prefixes P] [--seed S]
                                   [--handoff-trials T] [--trace]

About 16 minutes on 2 cores (a miss is seconds of prefill there; the
hand-off pairs take 4). Needs etcd (scripts/apt-deps) and the SmolLM2
package.
"""

import argparse
import asyncio
import contextlib
import json
import math
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
SYN = [sys.executable, "-m", "syntrop.cli.syn"]
NODES = ("a", "b", "c")
#: Tokens of a user turn beyond its characters: the chat template's markers.
TEMPLATE_TOKENS = 16
#: The fallback's hit: a TTFT under this many seconds (a miss's prefill of
#: ~1.5k tokens takes several on 2 cores).
HIT_S = 1.0
PHASES = ("affinity", "round-robin", "oracle")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "model name":
            return value.strip()
    return "unknown"


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
def nodes(root: Path, fleet: str | None,
          cpus: dict[str, set[int]] | None = None) -> Iterator[dict[str, int]]:
    """Three dev suites under root/<node>; their HTTP ports by node. With
    `cpus`, each node's daemons run on those CPUs only (inherited from the
    launcher: one host standing in for separate machines)."""
    ports = {name: free_port() for name in NODES}
    started = []
    try:
        for name, port in ports.items():
            directory = root / name
            (directory / "config").mkdir(parents=True)
            text = f'[http]\nlisten = ["127.0.0.1:{port}"]\n'
            if cpus:  # a prefill beside a stream on one core takes over a minute
                text += ('[[providers]]\nid = "local"\nkind = "runtimed"\n'
                         'models = ["smollm2"]\ntimeout = 300\n')
            if fleet:
                text += (f'[fleet]\netcd = ["{fleet}"]\nnode = "{name}"\n'
                         f'advertise = "http://127.0.0.1:{port}/v1"\nttl = 5\n')
            (directory / "config" / "routerd.toml").write_text(text)
            (directory / "config" / "runtimed.toml").write_text(
                "[runtimed]\nslots = 2\nn_ctx = 4096\n")
            pinned = cpus.get(name) if cpus else None
            subprocess.run([*SYN, "up", "--dir", str(directory), "--idle-timeout", "900"],
                           check=True, stdout=subprocess.DEVNULL, cwd=ROOT,
                           preexec_fn=(lambda c=pinned: os.sched_setaffinity(0, c))
                           if pinned else None)
            started.append(directory)
        for port in ports.values():  # the model loaded on every node
            def answered(port: int = port) -> "Answer":
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


@dataclass(frozen=True, slots=True)
class Cache:
    """What one node's runtimed holds now (Runtime1.GetLoad)."""

    prefixes: frozenset[str]
    contexts: int
    busy: int


async def _load(directory: Path) -> Cache:
    from syntrop.interfaces.runtime import Runtime1
    from syntrop.varlink.client import connect

    address = f"unix:{directory}/run/io.syntrop.Runtime1"
    async with await connect(Runtime1, address=address, timeout=10) as runtime:
        load = await runtime.GetLoad()
    models = load.get("models") or []
    # One model (SmolLM2) is loaded: its prefixes are the node's.
    return Cache(frozenset(d for m in models for d in (m.prefixes or [])),
                 sum(m.cached_contexts or 0 for m in models), sum(m.busy for m in models))


def caches(directories: dict[str, Path]) -> dict[str, Cache]:
    """Every node's cache once no node runs a request (a stream's result,
    which updates its report, lands just after its last chunk)."""
    async def read() -> dict[str, Cache]:
        deadline = time.monotonic() + 10
        while True:
            found = dict(zip(directories, await asyncio.gather(
                *(_load(d) for d in directories.values())), strict=True))
            if not any(c.busy for c in found.values()) or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.02)
    return asyncio.run(read())


def oracle_node(chat: list[dict[str, str]], found: dict[str, Cache]) -> tuple[str, int]:
    """The node holding the longest prefix of `chat` (and its characters),
    else the one with the fewest cached contexts (0 characters)."""
    from syntrop.prefix import chain, matched
    from syntrop.routerd.request import turns

    sent = turns({"model": "smollm2", "messages": chat})
    if sent is None:
        raise SystemExit("bench_affinity: routerd would refuse the workload's chat")
    prefixes = chain(sent)
    best = max(NODES, key=lambda n: (matched(prefixes, found[n].prefixes),
                                     -found[n].contexts, -NODES.index(n)))
    return best, matched(prefixes, found[best].prefixes)


@dataclass(frozen=True, slots=True)
class Answer:
    ttft: float
    provider: str
    prompt_tokens: int | None
    cached_tokens: int | None
    #: The helper's node when the entry node handed the prefill off.
    handoff: str | None = None


def ask(port: int, messages: list[dict[str, str]], forwarded: bool = False) -> Answer:
    """A streamed chat read to its end: seconds to its first content, the
    provider that served it (routerd's x-syntrop-provider) and its usage;
    `forwarded`: served by that node's own runtimed."""
    started = time.perf_counter()
    body = {"model": "smollm2", "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "messages": messages}
    first = None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                      headers={"x-syntrop-forwarded": "1"} if forwarded else {},
                      timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():  # to the end, as clients read
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            if first is None and any((c.get("delta") or {}).get("content")
                                     for c in chunk.get("choices") or []):
                first = time.perf_counter() - started
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
    if first is None:
        raise RuntimeError("the stream ended without content")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = usage.get("prompt_tokens")
    return Answer(first, response.headers.get("x-syntrop-provider", "?"),
                  prompt if isinstance(prompt, int) else None,
                  cached if isinstance(cached, int) else None,
                  response.headers.get("x-syntrop-handoff"))


@dataclass(frozen=True, slots=True)
class Request:
    messages: list[dict[str, str]]
    user: int
    entry: str  # the affinity phase's entry node


def workload(requests: int, prefixes: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    order = [i % prefixes for i in range(requests)]
    rng.shuffle(order)
    entries = [rng.choice(NODES) for _ in order]
    return [Request([{"role": "system", "content": system_prompt(p)},
                     {"role": "user", "content": f"Question {n}: which one is the oldest?"}],
                    p, entry)
            for n, (p, entry) in enumerate(zip(order, entries, strict=True))]


@dataclass(frozen=True, slots=True)
class Sample:
    ttft: float
    hit: bool
    measured: bool  # the hit from cached_tokens, not the TTFT fallback


def judged(answer: Answer, messages: list[dict[str, str]]) -> Sample:
    if answer.cached_tokens is None or answer.prompt_tokens is None:
        return Sample(answer.ttft, answer.ttft < HIT_S, False)
    user = len(messages[-1]["content"]) + TEMPLATE_TOKENS
    return Sample(answer.ttft, answer.cached_tokens >= answer.prompt_tokens - user, True)


def phase(root: Path, name: str, work: list[Request],
          trace: bool) -> tuple[list[Sample], float]:
    """Each request's sample, and the phase's wall seconds."""
    samples = []
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(etcd(root)) if name == "affinity" else None
        ports = stack.enter_context(nodes(root, fleet))
        directories = {n: root / n for n in NODES}
        started = time.perf_counter()
        for i, request in enumerate(work):
            note = ""
            if name == "affinity":
                node = request.entry
            elif name == "round-robin":
                node = NODES[i % len(NODES)]
            else:
                node, chars = oracle_node(request.messages, caches(directories))
                note = f" (resident {chars} chars)"
            answer = ask(ports[node], request.messages)
            sample = judged(answer, request.messages)
            samples.append(sample)
            if trace:
                print(f"  {name:<11} {i:3d} user {request.user} node {node} -> "
                      f"{answer.provider}{note}: {answer.ttft:.3f} s, cached "
                      f"{answer.cached_tokens}/{answer.prompt_tokens}"
                      f"{' hit' if sample.hit else ''}", file=sys.stderr)
        wall = time.perf_counter() - started
    return samples, wall


# the prefill hand-off -----------------------------------------------------------

#: The hand-off phase's CPUs per node: the busy home alone on one core, the
#: members that may help on the other (one host standing in for machines).
HANDOFF_CPUS = {"a": {0}, "b": {1}, "c": {1}}


def long_chat(index: int) -> list[dict[str, str]]:
    """About 2,300 prompt tokens, different per index, whose home (the
    rendezvous order over node ids, as routerd computes it) is node a."""
    from syntrop.prefix import chain
    from syntrop.routerd.request import turns
    from syntrop.routerd.scoring import homes

    while True:
        messages = [{"role": "system", "content": f"You are a guide to rivers (long set {index}). "
                     + " ".join(f"Rule {i}: answers about rivers stay short, calm and sourced."
                                for i in range(150))},
                    {"role": "user", "content": "Name one famous river."}]
        digests = chain(turns({"model": "smollm2", "messages": messages}) or [])
        if homes(digests[0][0], NODES)[0] == "a":
            return messages
        index += 1000


class Busy:
    """A long completion decoding on node a's own runtimed (forwarded),
    read in a thread until `stop`: node a is busy."""

    def __init__(self, port: int) -> None:
        import http.client
        import threading

        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.connection.request(
            "POST", "/v1/completions",
            headers={"content-type": "application/json", "x-syntrop-forwarded": "1"},
            body=json.dumps({"model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 3500,
                             "temperature": 0, "stream": True}))
        response = self.connection.getresponse()
        if response.status != 200:
            raise SystemExit(f"bench_affinity: the busy stream was refused ({response.status})")
        self.done = threading.Event()

        def read() -> None:
            with contextlib.suppress(OSError, AttributeError, ValueError):
                while not self.done.is_set() and response.readline():
                    pass
        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def stop(self) -> None:
        self.done.set()
        self.connection.close()  # routerd cancels it in runtimed
        self.reader.join(10)


def published_free(fleet: str, node: str) -> int | None:
    """The free slots `node` last published in etcd."""
    import base64

    key = base64.b64encode(f"/syntrop/fleet/nodes/{node}".encode()).decode()
    kvs = httpx.post(f"{fleet}/v3/kv/range", json={"key": key}, timeout=5).json().get("kvs")
    if not kvs:
        return None
    free = json.loads(base64.b64decode(kvs[0]["value"])).get("free_slots")
    return free if isinstance(free, int) else None


def handoff_phase(root: Path, trials: int, trace: bool) -> dict[str, Any]:
    """A ~2.3k-token chat whose home (a) is decoding a long stream: entered
    at b (routed to a, prefilled on an idle member and handed to a) and,
    interleaved, a chat of the same size sent straight to a (prefilled
    there beside its stream). Fresh prompts each time: nothing resident."""
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(etcd(root))
        ports = stack.enter_context(nodes(root, fleet, HANDOFF_CPUS))
        handed: list[Answer] = []
        home: list[Answer] = []
        for trial in range(trials):
            busy = Busy(ports["a"])
            try:
                wait_for(lambda: published_free(fleet, "a") == 1, 30)
                order = ("with", "without") if trial % 2 == 0 else ("without", "with")
                for k, how in enumerate(order):
                    chat = long_chat(10 * trial + k)
                    if how == "with":
                        answer = ask(ports["b"], chat)
                        handed.append(answer)
                    else:
                        answer = ask(ports["a"], chat, forwarded=True)
                        home.append(answer)
                    if trace:
                        print(f"  hand-off {trial} {how:<7} -> {answer.provider} (helper "
                              f"{answer.handoff}): {answer.ttft:.3f} s, cached "
                              f"{answer.cached_tokens}/{answer.prompt_tokens}", file=sys.stderr)
            finally:
                busy.stop()
    return {"with": [a.ttft for a in handed], "without": [a.ttft for a in home],
            "handed": sum(1 for a in handed if a.handoff and a.prompt_tokens and
                          a.cached_tokens == a.prompt_tokens - 1),
            "prompt_tokens": statistics.fmean(a.prompt_tokens or 0 for a in handed + home)}


def percentile(ordered: list[float], q: float) -> float:
    """Nearest rank: the smallest sample with at least q of them at or below."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(samples: list[Sample], wall: float) -> dict[str, float]:
    ordered = sorted(s.ttft for s in samples)
    return {"mean": statistics.fmean(ordered), "p50": statistics.median(ordered),
            "p99": percentile(ordered, 0.99), "hits": sum(s.hit for s in samples),
            "hits_by_ttft": sum(not s.measured for s in samples),
            "requests": len(samples), "wall_s": wall, "rps": len(samples) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--prefixes", type=int, default=6,
                        help="users, each with a system prompt of its own")
    parser.add_argument("--seed", type=int, default=7,
                        help="the order of the requests and the affinity phase's entry nodes")
    parser.add_argument("--trace", action="store_true",
                        help="print each request's node, provider, TTFT and cached tokens")
    parser.add_argument("--handoff-trials", type=int, default=3,
                        help="pairs of long chats to a busy home, with and without the "
                             "prefill hand-off (0: skip)")
    args = parser.parse_args()
    if shutil.which("etcd") is None:
        raise SystemExit("bench_affinity: etcd is not installed (scripts/apt-deps)")
    work = workload(args.requests, args.prefixes, args.seed)
    results = {}
    for name in PHASES:
        with tempfile.TemporaryDirectory(prefix=f"syntrop-affinity-{name}-") as scratch:
            results[name] = summary(*phase(Path(scratch), name, work, args.trace))
    ours, base, oracle = (results[n] for n in PHASES)
    print(f"{args.requests} requests, {args.prefixes} users with system prompts of ~1.5k "
          f"tokens, seed {args.seed}, 3 nodes x 2 slots; {cpu_model()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print("hits: cached_tokens covering the system prompt (usage.prompt_tokens_details); "
          "throughput: requests / wall seconds of each phase's sequential run")
    print(f"{'routing':<12} {'mean s':>8} {'p50 s':>8} {'p99 s':>8} {'hits':>7} {'req/s':>7}")
    for name, row in results.items():
        fallback = f" ({int(row['hits_by_ttft'])} by TTFT)" if row["hits_by_ttft"] else ""
        print(f"{name:<12} {row['mean']:8.3f} {row['p50']:8.3f} {row['p99']:8.3f} "
              f"{int(row['hits']):3d}/{int(row['requests']):<3d} {row['rps']:7.3f}{fallback}")
    speedup = base["p50"] / ours["p50"]
    share = ours["hits"] / oracle["hits"] if oracle["hits"] else None
    print(f"round-robin p50 / affinity p50: {speedup:.1f}x (floor 5x: "
          f"{'met' if speedup >= 5 else 'NOT met'})")
    if share is None:
        print("affinity hits / oracle hits: the oracle had no hit (floor 90%: not judged)")
    else:
        print(f"affinity hits / oracle hits: {share:.0%} (floor 90%: "
              f"{'met' if share >= 0.9 else 'NOT met'})")
    handoff = None
    if args.handoff_trials:
        with tempfile.TemporaryDirectory(prefix="syntrop-affinity-handoff-") as scratch:
            handoff = handoff_phase(Path(scratch), args.handoff_trials, args.trace)
        with_, without = statistics.median(handoff["with"]), statistics.median(handoff["without"])
        print(f"prefill hand-off: {args.handoff_trials} pairs of ~{handoff['prompt_tokens']:.0f}"
              "-token chats to a home decoding a long stream (home on CPU 0, the helpers on "
              f"CPU 1); {handoff['handed']} of {args.handoff_trials} answered from a handed "
              "state")
        print(f"  TTFT median: handed off {with_:.3f} s, prefilled at the busy home "
              f"{without:.3f} s (the floor); ratio {without / with_:.2f}x; samples "
              f"{[round(t, 2) for t in handoff['with']]} vs "
              f"{[round(t, 2) for t in handoff['without']]}")
    print(json.dumps({"requests": args.requests, "prefixes": args.prefixes, "seed": args.seed,
                      "phases": results, "p50_speedup": speedup, "hit_share": share,
                      "handoff": handoff}))


if __name__ == "__main__":
    main()
