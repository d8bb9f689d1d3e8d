#!/usr/bin/env python3
"""routerd against a fast loopback upstream, side by side with baselines
measured in the same run: added latency, requests/s, CPU per request, RSS
idle and after --requests requests, and start to first 200.

A minimal OpenAI-style upstream (asyncio + h11, fixed answers) runs in its
own process. In front of it, one process at a time:

  minimal  a bare asyncio + h11 relay (no routing, no checks): the floor of
           this design on this machine
  routerd  `python -m syntrop.routerd` with one openai provider
  litellm  LiteLLM proxy (1 worker), where its bench-only venv exists
           (python3 -m venv /tmp/litellm-venv &&
            /tmp/litellm-venv/bin/pip install 'litellm[proxy]');
           skipped with a message otherwise

One client process measures added latency against calling the upstream
directly (non-streamed, and time to the first SSE chunk streamed) on
keep-alive connections; then --clients client processes send --requests
requests for requests/s and the RSS after them.

With --concurrent N (default 400), N keep-alive connections at once, each
sending --each requests: the statuses they got (everything but 200 must be
a declared 503) and the proxy's peak RSS, sampled every 20 ms, against
routerd's MemoryHigh=24M.

    python bench/bench_routerd.py [--samples 1000] [--requests 10000] [--clients 4]
                                  [--concurrent 400] [--each 20]
"""

import argparse
import http.client
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEY = "sk-bench"
HEADERS = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
LITELLM_VENV = Path("/tmp/litellm-venv")
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
STREAM = json.dumps({"model": "m", "stream": True,
                     "messages": [{"role": "user", "content": "hi"}]}).encode()

UPSTREAM = r'''
import asyncio, json, sys
import h11
ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "hello"}}]}).encode()
CHUNK = b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "created": 0,
    "model": "m", "choices": [{"index": 0, "delta": {"content": "hello"},
                               "finish_reason": None}]}).encode() + b"\n\n"
SSE = [("content-type", "text/event-stream")]
ACCEPTED = [0]
async def serve(reader, writer):
    ACCEPTED[0] += 1
    conn = h11.Connection(h11.SERVER)
    body = b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    return
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                target = event.target
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if target == b"/connections":  # how many the proxy opened
                    count = str(ACCEPTED[0]).encode()
                    writer.write(conn.send(h11.Response(status_code=200, headers=[
                        ("content-length", str(len(count)))]))
                        + conn.send(h11.Data(data=count)) + conn.send(h11.EndOfMessage()))
                elif b'"stream": true' in body:
                    writer.write(conn.send(h11.Response(status_code=200, headers=SSE))
                        + conn.send(h11.Data(data=CHUNK))
                        + conn.send(h11.Data(data=b"data: [DONE]\n\n"))
                        + conn.send(h11.EndOfMessage()))
                else:
                    writer.write(conn.send(h11.Response(status_code=200, headers=[
                        ("content-type", "application/json"),
                        ("content-length", str(len(ANSWER)))]))
                        + conn.send(h11.Data(data=ANSWER)) + conn.send(h11.EndOfMessage()))
                await writer.drain()
                conn.start_next_cycle()
                body = b""
            elif isinstance(event, h11.ConnectionClosed):
                return
    except Exception:
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
'''

#: A bare relay: the floor for asyncio + h11 on this machine.
MINIMAL = r"""
import asyncio, sys
import h11
UP = int(sys.argv[2])
async def relay(reader, writer):
    conn = h11.Connection(h11.SERVER)
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", UP)
    try:
        while True:
            request, body = None, b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return
            client = h11.Connection(h11.CLIENT)
            up_writer.write(client.send(h11.Request(method="POST", target=request.target,
                headers=[("host", "up"), ("content-type", "application/json"),
                         ("content-length", str(len(body)))]))
                + client.send(h11.Data(data=body)) + client.send(h11.EndOfMessage()))
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await up_reader.read(65536))
                elif isinstance(event, h11.Response):
                    headers = [(k, v) for k, v in event.headers if k != b"content-length"]
                    out = conn.send(h11.Response(status_code=event.status_code, headers=headers))
                elif isinstance(event, h11.Data):
                    writer.write(out + conn.send(h11.Data(data=event.data)))
                    out = b""
                elif isinstance(event, h11.EndOfMessage):
                    writer.write(out + conn.send(h11.EndOfMessage()))
                    break
            await writer.drain()
            conn.start_next_cycle()
    except Exception:
        pass
    finally:
        up_writer.close()
        writer.close()
async def main():
    server = await asyncio.start_server(relay, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _timed(port: int, body: bytes, count: int, first_chunk: bool = False) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        connection.request("POST", "/v1/chat/completions", body=body, headers=HEADERS)
        response = connection.getresponse()
        if first_chunk:
            response.read1(65536)
            times.append(time.perf_counter() - started)
            response.read()
        else:
            response.read()
            times.append(time.perf_counter() - started)
        assert response.status == 200, response.status
    connection.close()
    return times


def _load(port: int, count: int, results: "multiprocessing.Queue[int]") -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(count):
        connection.request("POST", "/v1/chat/completions", body=BODY, headers=HEADERS)
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
    results.put(count)


def _concurrent(port: int, pid: int, clients: int, each: int) -> tuple[dict[int, int], float]:
    """`clients` connections at once, `each` requests on each (reconnecting
    after a 503, which closes): statuses counted, and the peak RSS of `pid`."""
    import asyncio
    import collections
    import threading

    statuses: collections.Counter[int] = collections.Counter()
    peak = [_rss_mib(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _rss_mib(pid))

    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
               b"content-type: application/json\r\nauthorization: Bearer " + KEY.encode()
               + b"\r\ncontent-length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)

    async def one() -> None:
        sent = 0
        while sent < each:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                statuses[0] += 1
                sent += 1
                continue
            try:
                while sent < each:
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = int(head.split(b" ", 2)[1])
                    lengths = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")]
                    if lengths:
                        await reader.readexactly(lengths[0])
                    else:  # chunked
                        while (size := int((await reader.readuntil(b"\r\n")).strip(), 16)):
                            await reader.readexactly(size + 2)
                        await reader.readuntil(b"\r\n")
                    statuses[status] += 1
                    sent += 1
                    if b"connection: close" in head.lower():
                        break
            except (OSError, asyncio.IncompleteReadError, ValueError):
                statuses[-1] += 1  # the connection failed without an answer
                sent += 1
            finally:
                writer.close()

    async def run() -> None:
        await asyncio.gather(*(one() for _ in range(clients)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        asyncio.run(run())
    finally:
        done.set()
        sampler.join()
    return dict(statuses), max(peak[0], _rss_mib(pid))


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer %s"
"""


def _upstream_connections(up_port: int) -> int:
    """Connections the upstream has accepted so far (this query's own
    included)."""
    connection = http.client.HTTPConnection("127.0.0.1", up_port, timeout=10)
    connection.request("GET", "/connections")
    count = int(connection.getresponse().read())
    connection.close()
    return count


def _wrk(port: int, connections: int, seconds: float, script: Path) -> tuple[float, float]:
    """requests/s and p99 latency (ms) of wrk with `connections` keep-alive
    connections, one thread (the machine has two cores: the proxy and the
    upstream need the rest)."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script),
         f"http://127.0.0.1:{port}/v1/chat/completions"],
        capture_output=True, text=True, check=True, timeout=seconds + 30).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk got errors through the proxy:\n{out}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"99%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    return rate, float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def sweep(up_port: int, levels: list[int], seconds: float) -> dict[str, dict[int, Any]]:
    """requests/s and p99 of the bare relay and of routerd at each number of
    connections, the two alternating per level, and the upstream
    connections routerd opened during each run."""
    rows: dict[str, dict[int, Any]] = {"minimal": {}, "routerd": {}}
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        script = root / "post.lua"
        script.write_text(WRK_SCRIPT % (BODY.decode(), KEY))
        processes = {}
        try:
            for proxy in rows:
                port = _free_port()
                process = _spawn(proxy, port, up_port, root / proxy, max(levels) * 2)
                assert process is not None
                _first_200(port, time.perf_counter(), process)
                processes[proxy] = (port, process)
            for level in levels:
                for proxy, (port, process) in processes.items():
                    _wrk(port, level, 1, script)  # warm: connections opened, pools filled
                    before = _upstream_connections(up_port)
                    rate, p99 = _wrk(port, level, seconds, script)
                    opened = _upstream_connections(up_port) - before - 1
                    rows[proxy][level] = {"rps": rate, "p99_ms": p99, "upstream_opened": opened,
                                          "rss": _rss_mib(process.pid)}
                ours, floor = rows["routerd"][level], rows["minimal"][level]
                print(f"sweep {level:4} connections: routerd {ours['rps']:7.0f} req/s p99 "
                      f"{ours['p99_ms']:6.2f} ms | relay {floor['rps']:7.0f} req/s p99 "
                      f"{floor['p99_ms']:6.2f} ms | {ours['rps'] / floor['rps']:.2f}x, p99 "
                      f"{ours['p99_ms'] / floor['p99_ms']:.2f}x | upstream connections opened "
                      f"in {seconds:g} s: routerd {ours['upstream_opened']}, relay "
                      f"{floor['upstream_opened']} | routerd RSS {ours['rss']:.1f} MiB",
                      flush=True)
        finally:
            for _, process in processes.values():
                process.terminate()
                process.wait(10)
    return rows


def _percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99)] * 1000


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _first_200(port: int, started: float, process: subprocess.Popen[bytes],
               limit: float = 120) -> float:
    """Seconds from `started` (the spawn) to the first 200 of a chat request."""
    while True:
        try:
            _timed(port, BODY, 1)
            return time.perf_counter() - started
        except (OSError, AssertionError, http.client.HTTPException):
            if process.poll() is not None or time.perf_counter() - started > limit:
                raise RuntimeError("the proxy did not answer") from None
            time.sleep(0.002)


def _spawn(name: str, port: int, up_port: int, root: Path,
           max_connections: int = 0) -> subprocess.Popen[bytes] | None:
    """Start a proxy; `max_connections` raises routerd's cap on client
    connections (the default 64 refuses more with 503, by design)."""
    root.mkdir(exist_ok=True)
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if name == "minimal":
        return subprocess.Popen([sys.executable, "-c", MINIMAL, str(port), str(up_port)],
                                **quiet)
    if name == "routerd":
        config = root / "config"
        config.mkdir(exist_ok=True)
        (root / "run").mkdir(exist_ok=True)
        (config / "routerd.toml").write_text(
            f'[http]\nlisten = ["127.0.0.1:{port}"]\n'
            + (f"max_connections = {max_connections}\n" if max_connections else "")
            + '[[providers]]\nid = "up"\n'
            f'kind = "openai"\nendpoint = "http://127.0.0.1:{up_port}/v1"\nmodels = ["m"]\n')
        env = {**os.environ, "CONFIGURATION_DIRECTORY": str(config),
               "RUNTIME_DIRECTORY": str(root / "run"), "SYNTROP_IDLE_TIMEOUT": "0"}
        return subprocess.Popen([sys.executable, "-m", "syntrop.routerd"], env=env, **quiet)
    program = LITELLM_VENV / "bin" / "litellm"
    if not program.exists():
        print(f"litellm: skipped, no bench venv at {LITELLM_VENV} (python3 -m venv "
              f"{LITELLM_VENV} && {LITELLM_VENV}/bin/pip install 'litellm[proxy]')")
        return None
    (root / "litellm.yaml").write_text(
        "model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
        f"      api_base: http://127.0.0.1:{up_port}/v1\n      api_key: unused\n")
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update(LITELLM_MASTER_KEY=KEY, LITELLM_LOCAL_MODEL_COST_MAP="True",
               LITELLM_TELEMETRY="False")
    return subprocess.Popen([str(program), "--config", str(root / "litellm.yaml"),
                             "--port", str(port), "--num_workers", "1"], env=env, **quiet)


def measure(name: str, up_port: int, args: argparse.Namespace,
            direct: tuple[float, float], direct_s: tuple[float, float]) -> dict[str, float] | None:
    port = _free_port()
    with tempfile.TemporaryDirectory() as root:
        started = time.perf_counter()
        process = _spawn(name, port, up_port, Path(root))
        if process is None:
            return None
        try:
            first = _first_200(port, started, process)
            time.sleep(1)
            idle = _rss_mib(process.pid)
            _timed(port, BODY, 100)
            slow = name == "litellm"
            samples = min(args.samples, args.litellm_requests // 2) if slow else args.samples
            cpu = _cpu_s(process.pid)
            plain = _percentiles(_timed(port, BODY, samples))
            cpu_per_request = (_cpu_s(process.pid) - cpu) / samples
            streamed = _percentiles(_timed(port, STREAM, samples, True))
            results: multiprocessing.Queue[int] = multiprocessing.Queue()
            share = (args.litellm_requests if slow else args.requests) // args.clients
            clients = [multiprocessing.Process(target=_load, args=(port, share, results))
                       for _ in range(args.clients)]
            began = time.perf_counter()
            for client in clients:
                client.start()
            total = sum(results.get() for _ in clients)
            elapsed = time.perf_counter() - began
            for client in clients:
                client.join()
            after = _rss_mib(process.pid)
            statuses, peak = _concurrent(port, process.pid, args.concurrent, args.each) \
                if args.concurrent else ({}, 0.0)
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    row = {"first_200_ms": first * 1000, "rss_idle": idle, "rss_after": after,
           "served": 100 + 2 * samples + total + 1,
           "added_p50": plain[0] - direct[0], "added_p99": plain[1] - direct[1],
           "added_s_p50": streamed[0] - direct_s[0], "added_s_p99": streamed[1] - direct_s[1],
           "rps": total / elapsed, "cpu_us": cpu_per_request * 1e6, "peak": peak}
    print(f"{name:8} first 200 {row['first_200_ms']:7.0f} ms | added p50/p99 "
          f"{row['added_p50']:.3f}/{row['added_p99']:.3f} ms, first chunk "
          f"{row['added_s_p50']:.3f}/{row['added_s_p99']:.3f} ms | {row['rps']:6.0f} req/s "
          f"({args.clients} clients) | CPU {row['cpu_us']:5.0f} us/req | RSS idle "
          f"{idle:.1f} MiB, after {int(row['served'])} requests {after:.1f} MiB", flush=True)
    if args.concurrent:
        shown = ", ".join(f"{'no answer' if code < 0 else 'refused' if code == 0 else code}: "
                          f"{count}" for code, count in sorted(statuses.items()))
        print(f"{name:8} {args.concurrent} connections at once x {args.each}: {shown}; "
              f"peak RSS {peak:.1f} MiB (MemoryHigh 24 MiB)", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1000,
                        help="sequential requests per latency figure")
    parser.add_argument("--requests", type=int, default=10000,
                        help="requests of the throughput phase (RSS is read after them)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--concurrent", type=int, default=400,
                        help="connections at once in the last phase (0: skip it)")
    parser.add_argument("--each", type=int, default=20, help="requests per connection there")
    parser.add_argument("--litellm-requests", type=int, default=1000,
                        help="LiteLLM's share of the load phase and samples (it serves ~50/s "
                             "here: 10,000 would take minutes)")
    parser.add_argument("--only", nargs="*", default=["minimal", "routerd", "litellm"])
    parser.add_argument("--sweep", type=int, nargs="*", default=[1, 8, 64, 256],
                        help="connection counts of the wrk sweep, routerd against the bare "
                             "relay (none: skip it; it needs wrk)")
    parser.add_argument("--sweep-seconds", type=float, default=4.0)
    args = parser.parse_args()
    up_port = _free_port()
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)],
                                stdout=subprocess.PIPE)
    rows: dict[str, dict[str, float]] = {}
    try:
        assert upstream.stdout is not None
        upstream.stdout.readline()
        _timed(up_port, BODY, 200)
        direct = _percentiles(_timed(up_port, BODY, args.samples))
        direct_s = _percentiles(_timed(up_port, STREAM, args.samples, True))
        print(f"direct   p50/p99 {direct[0]:.3f}/{direct[1]:.3f} ms, first chunk "
              f"{direct_s[0]:.3f}/{direct_s[1]:.3f} ms", flush=True)
        for name in args.only:
            row = measure(name, up_port, args, direct, direct_s)
            if row is not None:
                rows[name] = row
        if args.sweep and shutil.which("wrk") is None:
            print("sweep: skipped, no wrk on PATH (scripts/apt-deps installs it)")
        elif args.sweep:
            sweep(up_port, args.sweep, args.sweep_seconds)
    finally:
        upstream.terminate()
        upstream.wait()
    if "routerd" in rows:
        ours = rows["routerd"]
        for name in ("minimal", "litellm"):
            if name in rows:
                other = rows[name]
                print(f"routerd vs {name}: {ours['rps'] / other['rps']:.2f}x requests/s, "
                      f"CPU per request {ours['cpu_us']:.0f} vs {other['cpu_us']:.0f} us, "
                      f"added p50 {ours['added_p50']:.3f} vs {other['added_p50']:.3f} ms, "
                      f"RSS {ours['rss_after']:.1f} vs {other['rss_after']:.1f} MiB, "
                      f"first 200 {ours['first_200_ms']:.0f} vs {other['first_200_ms']:.0f} ms")


if __name__ == "__main__":
    main()
