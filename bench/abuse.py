#!/usr/bin/env python3
"""Hostile input against every daemon, socket-activated in a scratch
directory the way `syn up` starts them:

1. --messages malformed messages per daemon (bytes, broken JSON, wrong
   shapes and types, unknown methods, deep nesting, stray fds-less
   streaming flags), sent on reconnecting connections: the daemon must
   still answer GetInfo afterwards, and every reply must be a Varlink
   error (a closed connection is allowed);
2. 20 connections of one uid, each sending 15 MiB of a message that never
   ends: the daemon's RSS must stay under its idle RSS plus the per-uid cap
   (32 MiB) plus 16 MiB of slack, and the connections past the cap closed;
3. 100 slowloris connections per daemon (a byte every second, never the
   NUL): all closed within the partial-message timeout (30 s) plus 5 s;
4. routerd's HTTP ingress, first of all (so that its peak RSS is theirs):
   --http-rounds rounds of hostile HTTP requests of up to 1 MiB each
   (bodies over the cap, declared or chunked; JSON nested 100,000 deep;
   fields of the wrong type; a body declared text/plain; a 1 MB prompt;
   1 MiB of small JSON values; bytes that are not UTF-8; an oversized
   head): each must get its 4xx, /health must still answer, and routerd's
   peak RSS (VmHWM, start-up included) must stay within 24 MiB, its
   unit's MemoryHigh.

Prints one line per daemon and check; exits 1 if any check failed. Not in
CI's budget (about two minutes):

    python -m bench.abuse [--messages 100000] [--only modeld routerd]
    python -m bench.abuse --only routerd --http-only
"""

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20
PER_UID_CAP = 32 * MiB
#: routerd's unit: MemoryHigh=24M.
ROUTERD_HIGH = 24 * MiB
#: Its configuration here: one provider (never reached: every request
#: below is refused before routing) for the context window's check.
ROUTERD_CONFIG = """
[http]
listen = []
max_body_bytes = 1048576

[[providers]]
id = "nowhere"
kind = "openai"
endpoint = "http://127.0.0.1:9/v1"
models = ["m"]
context_window = 32768
"""
PARTIAL_TIMEOUT = 30.0
GETINFO = b'{"method":"org.varlink.service.GetInfo"}\0'


def hostile(rng: random.Random, interface: str) -> bytes:
    """One malformed message (NUL-terminated)."""
    kind = rng.randrange(12)
    if kind == 0:
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).replace(b"\0", b"")
    elif kind == 1:
        body = b'{"method": "' + interface.encode() + b'.' + b"x" * rng.randrange(1, 300)
    elif kind == 2:
        body = json.dumps(rng.choice([[], 1, "s", None, True, 1.5])).encode()
    elif kind == 3:
        body = json.dumps({"parameters": {}}).encode()
    elif kind == 4:
        body = json.dumps({"method": rng.choice([1, [], {}, None, ""])}).encode()
    elif kind == 5:
        body = json.dumps({"method": f"{interface}.NoSuchMethod{rng.randrange(9)}"}).encode()
    elif kind == 6:
        body = json.dumps({"method": f"{interface}.GetStatus",
                           "parameters": rng.choice([[], "x", 1, None])}).encode()
    elif kind == 7:
        depth = rng.randrange(100, 5000)
        body = b'{"method":"' + interface.encode() + b'.X","parameters":{"a":' + \
            b"[" * depth + b"]" * depth + b"}}"
    elif kind == 8:
        body = json.dumps({"method": "org.varlink.service.GetInterfaceDescription",
                           "parameters": {"interface": rng.choice([1, "", "a" * 5000, None])}}
                          ).encode()
    elif kind == 9:
        body = json.dumps({"method": f"{interface}.GetStatus", "more": rng.choice([1, "y"]),
                           "oneway": rng.choice([[], 2])}).encode()
    elif kind == 10:
        body = json.dumps({"method": f"{interface}.ListIncidents" if "Sentry" in interface
                           else f"{interface}.List", "parameters": {
                               "limit": rng.choice([-1, 2**70, 1.5, "1", True]),
                               "unit": rng.choice([1, "\u0000x", "a" * 70000])}}).encode()
    else:
        body = b'{"method":"' + interface.encode() + b'.GetStatus","parameters":{"x":"' + \
            "\udcff".encode("utf-8", "surrogatepass") + b'"}}'
    return body + b"\0"


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock


def read_reply(sock: socket.socket) -> bytes | None:
    data = b""
    while not data.endswith(b"\0"):
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    return data


def answers(path: str) -> bool:
    try:
        with connect(path) as sock:
            sock.sendall(GETINFO)
            reply = read_reply(sock)
            return reply is not None and b'"parameters"' in reply
    except OSError:
        return False


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def flood(path: str, interface: str, count: int, seed: int) -> tuple[int, int, int]:
    """(errors answered, connections closed by the daemon, bad replies)."""
    rng = random.Random(seed)
    errors = closed = bad = 0
    sock = connect(path)
    for _ in range(count):
        message = hostile(rng, interface)
        try:
            sock.sendall(message)
            reply = read_reply(sock)
        except OSError:
            reply = None
        if reply is None:
            closed += 1
            sock.close()
            sock = connect(path)
            continue
        try:
            decoded = json.loads(reply[:-1])
            if "error" in decoded:
                errors += 1
            else:
                bad += 1
        except ValueError:
            bad += 1
    sock.close()
    return errors, closed, bad


def partial(path: str, pid: int) -> tuple[float, float, int]:
    """(idle RSS, peak RSS, connections closed) for 20 x 15 MiB unfinished."""
    idle = rss_mib(pid)
    chunk = b"[" * MiB
    socks, cut, peak = [], 0, idle
    for _ in range(20):
        sock = connect(path)
        try:
            for _ in range(15):
                sock.sendall(chunk)
        except OSError:
            cut += 1
        socks.append(sock)
        time.sleep(0.05)
        peak = max(peak, rss_mib(pid))
    time.sleep(0.5)
    peak = max(peak, rss_mib(pid))
    for sock in socks:
        sock.close()
    return idle, peak, cut


def _still_open(socks: list[socket.socket]) -> int:
    """Feed each a byte; how many took it."""
    alive = 0
    for sock in socks:
        try:
            sock.sendall(b" ")
            alive += 1
        except OSError:
            pass
    return alive


def slowloris(paths: dict[str, str], per_daemon: int = 100) -> dict[str, tuple[int, float]]:
    """Open, feed a byte a second, and time how long until each daemon has
    closed them all: name → (still open at the deadline, seconds taken)."""
    conns = {name: [connect(path) for _ in range(per_daemon)] for name, path in paths.items()}
    started = time.monotonic()
    done: dict[str, float] = {}
    deadline = started + PARTIAL_TIMEOUT + 5
    while time.monotonic() < deadline and len(done) < len(conns):
        for name, socks in conns.items():
            if name in done:
                continue
            if _still_open(socks) == 0:
                done[name] = time.monotonic() - started
        time.sleep(1)
    result = {}
    for name, socks in conns.items():
        result[name] = (_still_open(socks), done.get(name, time.monotonic() - started))
        for sock in socks:
            sock.close()
    return result


def _chat(**fields: object) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       **fields}).encode()


def _post(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: %s\r\n"
            b"content-length: %d\r\n\r\n%s" % (content_type, len(body), body))


def http_cases() -> list[tuple[str, bytes, int]]:
    """(name, bytes sent, status expected): hostile requests of up to 1 MiB."""
    deep = 100_000
    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
    many = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 0, "x": [' + \
        b"1.5," * 250_000 + b"1.5]}"
    return [
        ("declared 16 MiB", b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
         b"content-type: application/json\r\ncontent-length: 16777216\r\n\r\n", 413),
        ("chunked 2 MiB", b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
         b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n" + chunk * 32,
         413),
        ("array 100,000 deep", _post(b"[" * deep + b"]" * deep), 400),
        ("field 500,000 deep", _post(b'{"model": "m", "x": ' + b"[" * 500_000 +
                                     b"]" * 500_000 + b"}"), 400),
        ("stop an object", _post(_chat(stop={"a": 1})), 400),
        ("content a number", _post(json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": 5}]}).encode()), 400),
        ("text/plain", _post(_chat(), b"text/plain"), 415),
        ("1 MB prompt", _post(json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "a" * 1_000_000}]}).encode()), 400),
        ("1 MiB of small values", _post(many), 400),
        ("1 MiB of messages", _post(_chat(messages=[{"role": "user", "content": "x"}] * 25_000,
                                          n=0)), 400),
        ("1 MiB not UTF-8", _post(b"\xff" * 1_000_000), 400),
        ("head of 20 KiB", b"GET /health HTTP/1.1\r\nx: " + b"a" * 20_000 + b"\r\n\r\n", 431),
    ]


def http_exchange(port: int, data: bytes) -> int:
    """Send `data` (as far as routerd takes it), read its answer: the
    status, or 0 when the connection closed without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        answer = b""
        with contextlib.suppress(OSError):  # refused before the whole of it was sent
            sock.sendall(data)
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in answer:
                got = sock.recv(65536)
                if not got:
                    break
                answer += got
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def http_abuse(port: int, pid: int, rounds: int) -> bool:
    """routerd's HTTP cases, `rounds` times each; prints and returns
    whether every answer was right and the peak RSS within ROUTERD_HIGH."""
    while http_exchange(port, b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n") != 200:
        time.sleep(0.1)
    idle, peak = rss_mib(pid), peak_rss_mib(pid)
    cases, wrong = http_cases(), []
    for _ in range(rounds):
        for name, data, expected in cases:
            got = http_exchange(port, data)
            if got != expected:
                wrong.append(f"{name}: {got} (not {expected})")
    alive = http_exchange(port, b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n") == 200
    after, high = rss_mib(pid), peak_rss_mib(pid)
    ok = alive and not wrong and high <= ROUTERD_HIGH / MiB
    print(f"{'routerd':15} {rounds} x {len(cases)} hostile HTTP requests: "
          f"{len(wrong)} wrong answers{': ' + '; '.join(sorted(set(wrong))) if wrong else ''}; "
          f"RSS {idle:.1f} → {after:.1f} MiB, peak (VmHWM) {peak:.1f} → {high:.1f} MiB "
          f"(limit {ROUTERD_HIGH / MiB:.0f}); "
          f"{'still answers' if alive else 'DEAD'}: {'ok' if ok else 'FAILED'}", flush=True)
    return ok


def main() -> None:
    from syntrop.cli.launcher import DAEMONS, daemon_environment, spawn_activated

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--only", nargs="*", default=[d.program for d in DAEMONS])
    parser.add_argument("--http-rounds", type=int, default=10)
    parser.add_argument("--http-only", action="store_true",
                        help="routerd's HTTP cases only (with --only routerd)")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "run").mkdir()
        pids: dict[str, int] = {}
        paths: dict[str, str] = {}
        interfaces: dict[str, str] = {}
        http_port = 0
        for daemon in DAEMONS:
            if daemon.program not in args.only:
                continue
            path = str(root / "run" / daemon.interface)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(4096)
            env = {**daemon_environment(root, daemon), "SYNTROP_IDLE_TIMEOUT": "0"}
            extra = []
            if daemon.program == "routerd":  # its HTTP ingress, as routerd.socket passes it
                (root / "config" / "routerd.toml").write_text(ROUTERD_CONFIG)
                extra = [socket.create_server(("127.0.0.1", 0), backlog=128)]
                http_port = extra[0].getsockname()[1]
            pids[daemon.program] = spawn_activated(
                [sys.executable, "-m", daemon.module], listener, env,
                log=root / f"{daemon.program}.log", extra=extra)
            listener.close()
            for sock in extra:
                sock.close()
            paths[daemon.program], interfaces[daemon.program] = path, daemon.interface
        try:
            if "routerd" in pids:
                failed |= not http_abuse(http_port, pids["routerd"], args.http_rounds)
            if args.http_only:
                paths = {}
            for name, path in paths.items():
                deadline = time.monotonic() + 60
                while not answers(path) and time.monotonic() < deadline:
                    time.sleep(0.1)
                started = time.monotonic()
                errors, closed, bad = flood(path, interfaces[name], args.messages, seed=7)
                rate = args.messages / (time.monotonic() - started)
                alive = answers(path)
                ok = alive and bad == 0
                failed |= not ok
                print(f"{name:15} {args.messages} hostile messages: {errors} errors answered, "
                      f"{closed} connections closed, {bad} bad replies, {rate:,.0f}/s; "
                      f"{'still answers' if alive else 'DEAD'}: {'ok' if ok else 'FAILED'}",
                      flush=True)
                idle, peak, cut = partial(path, pids[name])
                limit = idle + PER_UID_CAP / MiB + 16
                ok = peak <= limit and answers(path)
                failed |= not ok
                print(f"{name:15} 20 x 15 MiB unfinished: RSS {idle:.1f} → peak {peak:.1f} MiB "
                      f"(limit {limit:.1f}), {cut} connections cut: {'ok' if ok else 'FAILED'}",
                      flush=True)
            for name, (still, took) in (slowloris(paths) if paths else {}).items():
                ok = still == 0
                failed |= not ok
                print(f"{name:15} 100 slowloris connections: {still} still open, all closed "
                      f"after {took:.1f} s: {'ok' if ok else 'FAILED'}", flush=True)
        finally:
            for pid in pids.values():
                os.kill(pid, signal.SIGTERM)
            for pid in pids.values():
                os.waitpid(pid, 0)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
