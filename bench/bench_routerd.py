#!/usr/bin/env python3
"""routerd against a fast loopback upstream: added latency and requests/s.

A minimal OpenAI-style upstream (asyncio + h11, fixed answers) runs in its
own process; routerd runs as `python -m syntrop.routerd` with one openai
provider pointing at it. One client process measures, on keep-alive
connections:

  direct   POST /v1/chat/completions to the upstream
  routed   the same through routerd (non-streamed, and time to first SSE
           chunk streamed)

then requests/s through routerd with --clients client processes.

    python bench/bench_routerd.py [--requests 2000] [--clients 4]
"""

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
async def serve(reader, writer):
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
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if b'"stream": true' in body:
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
        connection.request("POST", "/v1/chat/completions", body=body,
                           headers={"content-type": "application/json"})
        response = connection.getresponse()
        if first_chunk:
            response.read1(65536)
            times.append(time.perf_counter() - started)
            response.read()
        else:
            response.read()
            times.append(time.perf_counter() - started)
        assert response.status == 200
    connection.close()
    return times


def _load(port: int, seconds: float, results: "multiprocessing.Queue[int]") -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    done = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        connection.request("POST", "/v1/chat/completions", body=BODY,
                           headers={"content-type": "application/json"})
        connection.getresponse().read()
        done += 1
    results.put(done)


def _percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99)] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    up_port, router_port = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as root:
        config = Path(root) / "config"
        config.mkdir()
        (Path(root) / "run").mkdir()
        (config / "routerd.toml").write_text(
            f'[http]\nlisten = ["127.0.0.1:{router_port}"]\n[[providers]]\nid = "up"\n'
            f'kind = "openai"\nendpoint = "http://127.0.0.1:{up_port}/v1"\nmodels = ["m"]\n')
        env = {**os.environ, "CONFIGURATION_DIRECTORY": str(config),
               "RUNTIME_DIRECTORY": str(Path(root) / "run"), "SYNTROP_IDLE_TIMEOUT": "0"}
        upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)],
                                    stdout=subprocess.PIPE)
        router = subprocess.Popen([sys.executable, "-m", "syntrop.routerd"], env=env,
                                  stderr=subprocess.DEVNULL)
        try:
            assert upstream.stdout is not None
            upstream.stdout.readline()
            deadline = time.monotonic() + 10
            while True:
                try:
                    _timed(router_port, BODY, 1)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            _timed(up_port, BODY, 200)
            _timed(router_port, BODY, 200)
            direct = _percentiles(_timed(up_port, BODY, args.requests))
            routed = _percentiles(_timed(router_port, BODY, args.requests))
            direct_s = _percentiles(_timed(up_port, STREAM, args.requests, True))
            routed_s = _percentiles(_timed(router_port, STREAM, args.requests, True))
            results: multiprocessing.Queue[int] = multiprocessing.Queue()
            clients = [multiprocessing.Process(target=_load,
                                               args=(router_port, args.seconds, results))
                       for _ in range(args.clients)]
            for client in clients:
                client.start()
            total = sum(results.get() for _ in clients)
            for client in clients:
                client.join()
            rss = next(line.split()[1] for line in
                       Path(f"/proc/{router.pid}/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
        finally:
            router.terminate()
            upstream.terminate()
            router.wait()
            upstream.wait()
    print(f"non-streamed  direct p50 {direct[0]:.3f} ms p99 {direct[1]:.3f} ms; "
          f"routed p50 {routed[0]:.3f} ms p99 {routed[1]:.3f} ms; "
          f"added p50 {routed[0] - direct[0]:.3f} ms p99 {routed[1] - direct[1]:.3f} ms")
    print(f"first chunk   direct p50 {direct_s[0]:.3f} ms p99 {direct_s[1]:.3f} ms; "
          f"routed p50 {routed_s[0]:.3f} ms p99 {routed_s[1]:.3f} ms; "
          f"added p50 {routed_s[0] - direct_s[0]:.3f} ms p99 {routed_s[1] - direct_s[1]:.3f} ms")
    print(f"throughput    {total / args.seconds:.0f} requests/s through routerd "
          f"({args.clients} clients)")
    print(f"routerd VmRSS {int(rss) / 1024:.1f} MiB after the run")


if __name__ == "__main__":
    main()
