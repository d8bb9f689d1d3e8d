#!/usr/bin/env python3
"""Echo round trips over three Varlink servers, measured by one client.

The servers, each in its own process on a Unix socket in a temporary folder,
all serve the bench-only interface io.syntrop.Bench1 (IDL below):

  ours            syntrop.varlink.server.Server with a contract class from
                  syntrop.varlink.contract (what every syntrop daemon runs)
  python-varlink  varlink.ThreadingServer (one thread per connection) with
                  the interface given as a .varlink text
  asyncvarlink    raw asyncvarlink: create_unix_server +
                  VarlinkInterfaceRegistry

The client is the same code for all three: a blocking socket that sends
{"method":"io.syntrop.Bench1.Echo","parameters":{"text":…}}\\0 and reads up
to the reply's NUL. Client processes are separate from the server process.

Scenarios:

  sequential  one client process, one connection, one call at a time
  concurrent  8 connections: 8 client processes with one connection each
              (--procs/--threads change the split; processes rather than
              threads so that no client GIL sits between a reply and the
              next call)

All servers run for the whole benchmark; one pool of client processes per
scenario holds a connection to each. The clients call one server at a time in
timed windows (3 rounds x 1.5 s per server by default, the order rotated each
round, a short untimed warm-up before every window), so load from elsewhere on
the machine spreads over all servers alike. Windows are instants of
CLOCK_MONOTONIC (system-wide on Linux) shared by all client processes.
Reported: calls/s over that window, p50/p99 latency of a round trip as the
client sees it, and the server's CPU time per call (utime+stime of the server
process over the window, from /proc): on a 2-core machine the client and the
server share the CPUs, so CPU per call is the figure least moved by
scheduling. Ratios: ours / python-varlink (target >= 1.5) and ours /
asyncvarlink.

A fourth server, (asyncio-floor), is a reference and not Varlink: asyncio's
add_reader, one recv, json.loads/dumps, one send. It shows what the event
loop, the syscalls and the JSON cost on this machine, i.e. how far ours is
from the least a Python asyncio server can do.

    python bench/bench_bus.py                # table (about 45 s on 2 cores)
    python bench/bench_bus.py --json         # JSON on stdout
    python bench/bench_bus.py --profile      # cProfile of our server, sequential load
    python bench/bench_bus.py --inprocess    # CPU per call of our connection code alone
    python bench/bench_bus.py --candidate DIR
        # also serve DIR/syntrop (a changed copy of src/) as "candidate",
        # interleaved with ours: how a change to server.py is measured

Internal entry points (used by the above): `serve KIND PATH`, `client …`.
"""

import argparse
import array
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

INTERFACE = "io.syntrop.Bench1"
METHOD = f"{INTERFACE}.Echo"
#: The interface, as python-varlink is given it. The other two servers
#: derive the same text from Python annotations; `serve ours` checks that.
IDL = f"""\
interface {INTERFACE}

method Echo(text: string) -> (text: string)
"""
SERVERS = ("ours", "python-varlink", "asyncvarlink")
#: Not compared against: a floor showing what the transport alone costs.
REFERENCES = ("asyncio-floor",)
#: Set by --candidate: a source tree whose syntrop is served as "candidate".
CANDIDATE: dict[str, str | None] = {"path": None}
TARGET_RATIO = 1.5
HERE = os.path.abspath(__file__)

# servers ---------------------------------------------------------------------


def _ready() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def _squash(idl: str) -> str:
    return "".join(idl.split())


def _ours_service() -> Any:
    from syntrop.varlink.contract import Interface, implements, method

    class Bench1(Interface, name=INTERFACE):
        """Benchmark-only interface: one trivial method."""

        @method(return_parameter="text")
        def Echo(self, *, text: str) -> str:
            """Answer the text unchanged.

            Parameters:
                text: Anything.

            Returns:
                text: The same text.
            """
            raise NotImplementedError  # a contract: never run

    class Bench1Service(Bench1):
        @implements
        def Echo(self, *, text: str) -> str:
            return text

    rendered = Bench1.render_interface_description(comments=False)
    # Every syntrop contract also declares InternalError, the generic
    # answer to a failed call; the others' Echo is the same.
    if _squash(rendered) != _squash(IDL + "error InternalError (method: string)"):
        raise SystemExit(f"contract renders differently from the bench IDL: {rendered!r}")
    return Bench1Service()


async def _serve_ours(path: str) -> None:
    import asyncio

    from syntrop.varlink.server import Server, bind_unix

    server = Server([_ours_service()], product="bench")
    server.add_listener(bind_unix(path))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.stop)
    _ready()
    try:
        await server.stopped.wait()
    finally:
        await server.close()


async def _serve_asyncvarlink(path: str) -> None:
    import asyncio

    from asyncvarlink import (
        VarlinkInterface,
        VarlinkInterfaceRegistry,
        create_unix_server,
        varlinkmethod,
    )

    class Bench1(VarlinkInterface, name=INTERFACE):
        @varlinkmethod(return_parameter="text")
        def Echo(self, *, text: str) -> str:
            return text

    rendered = Bench1.render_interface_description()
    if _squash(rendered) != _squash(IDL):
        raise SystemExit(f"asyncvarlink renders differently from the bench IDL: {rendered!r}")
    registry = VarlinkInterfaceRegistry()
    registry.register_interface(Bench1())
    # create_unix_server binds, and start_serving() calls listen(1): the
    # 8-client scenario's blocking connects wait in turn, before timing.
    server = await create_unix_server(registry.protocol_factory, path)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    _ready()
    await stop.wait()
    server.close()


def _serve_python_varlink(path: str) -> None:
    import varlink

    directory = os.path.dirname(path)
    idl_file = os.path.join(directory, f"{INTERFACE}.varlink")
    with open(idl_file, "w") as file:
        file.write(IDL)
    service = varlink.Service(vendor="bench", product="bench", version="1", url="",
                              interface_dir=directory)

    @service.interface(INTERFACE)
    class Bench1:
        def Echo(self, text: str) -> dict[str, str]:
            return {"text": text}

    class Handler(varlink.RequestHandler):  # type: ignore[misc]
        pass

    Handler.service = service
    server = varlink.ThreadingServer(f"unix:{path}", Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    _ready()
    with server:
        server.serve_forever()


async def _serve_floor(path: str) -> None:
    """The least an asyncio Varlink server can do: add_reader, one recv, json,
    one send, no validation and no types. Not a Varlink implementation; a
    floor for the cost of the event loop, the syscalls and the JSON."""
    import asyncio

    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(socket.SOMAXCONN)
    listener.setblocking(False)
    methods = {METHOD: lambda parameters: {"text": parameters["text"]}}

    def on_readable(conn: socket.socket, buffer: bytearray) -> None:
        data = conn.recv(65536)
        if not data:
            loop.remove_reader(conn.fileno())
            conn.close()
            return
        buffer += data
        while (end := buffer.find(b"\0")) >= 0:
            call = json.loads(buffer[:end])
            del buffer[: end + 1]
            reply = {"parameters": methods[call["method"]](call.get("parameters", {}))}
            conn.sendall(json.dumps(reply).encode() + b"\0")  # small: fits the buffer

    def on_acceptable() -> None:
        conn, _ = listener.accept()
        conn.setblocking(False)
        loop.add_reader(conn.fileno(), on_readable, conn, bytearray())

    loop.add_reader(listener.fileno(), on_acceptable)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    _ready()
    await stop.wait()


def serve(kind: str, path: str) -> None:
    if kind == "ours":
        import asyncio

        asyncio.run(_serve_ours(path))
    elif kind == "asyncvarlink":
        import asyncio

        asyncio.run(_serve_asyncvarlink(path))
    elif kind == "python-varlink":
        _serve_python_varlink(path)
    elif kind == "asyncio-floor":
        import asyncio

        asyncio.run(_serve_floor(path))
    else:
        raise SystemExit(f"unknown server {kind}")


# the client (the same for every server) --------------------------------------


def _round_trip(sock: socket.socket, message: bytes) -> bytes:
    sock.sendall(message)
    data = sock.recv(65536)
    while not data.endswith(b"\0"):
        more = sock.recv(65536)
        if not more:
            raise ConnectionError("server closed the connection mid-reply")
        data += more
    return data


Connected = tuple[dict[str, socket.socket], dict[str, bytes]]


def _connect(paths: dict[str, str], message: bytes, text: str) -> Connected:
    """One connection to each server, each checked with a first call."""
    connections: dict[str, socket.socket] = {}
    expected: dict[str, bytes] = {}
    for kind, path in paths.items():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        # The first reply is parsed and checked; later ones must be the same bytes.
        expected[kind] = _round_trip(sock, message)
        reply = json.loads(expected[kind][:-1])
        if reply != {"parameters": {"text": text}}:
            raise SystemExit(f"{kind}: unexpected reply {reply!r}")
        connections[kind] = sock
    return connections, expected


def _client_thread(message: bytes, connected: Connected, windows: list[Any],
                   out: list[Any], index: int) -> None:
    connections, expected = connected
    latencies = {kind: array.array("q") for kind in connections}
    mismatches = dict.fromkeys(connections, 0)
    clock = time.perf_counter_ns  # CLOCK_MONOTONIC, like time.monotonic
    late = clock() > int(windows[0][1] * 1e9)
    for kind, start, end in windows:
        sock, record, good = connections[kind], latencies[kind], expected[kind]
        start_ns, end_ns = int(start * 1e9), int(end * 1e9)
        # Calls before start_ns warm this connection up and are not recorded.
        while True:
            t0 = clock()
            if t0 >= end_ns:
                break
            if _round_trip(sock, message) != good:
                mismatches[kind] += 1
            if t0 >= start_ns:
                record.append(clock() - t0)
    for sock in connections.values():
        sock.close()
    out[index] = (latencies, mismatches, late)


def client(plan_file: str, output_prefix: str) -> None:
    """Connect, say "ready" on stdout, read the windows (a JSON line) from
    stdin, call through them, write latencies and a JSON summary."""
    with open(plan_file) as file:
        plan = json.load(file)
    threads, text = plan["threads"], plan["text"]
    message = json.dumps({"method": METHOD, "parameters": {"text": text}}).encode() + b"\0"
    connected = [_connect(plan["paths"], message, text) for _ in range(threads)]
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    windows = json.loads(sys.stdin.readline())
    results: list[Any] = [None] * threads
    workers = [threading.Thread(target=_client_thread,
                                args=(message, connected[i], windows, results, i))
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if any(result is None for result in results):
        raise SystemExit("a client thread failed")
    summary: dict[str, Any] = {}
    for kind in plan["paths"]:
        merged = array.array("q")
        for latencies, _, _ in results:
            merged.extend(latencies[kind])
        with open(f"{output_prefix}-{kind}.lat", "wb") as file:
            merged.tofile(file)
        summary[kind] = {"calls": len(merged),
                         "mismatches": sum(r[1][kind] for r in results)}
    summary["late"] = sum(1 for r in results if r[2])
    json.dump(summary, sys.stdout)


# orchestration ----------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_server(kind: str, path: str, *, profile: str | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable]
    if profile:
        argv += ["-m", "cProfile", "-o", profile]
    env = None
    if kind == "candidate":
        # Our server from another source tree (a changed copy of src/), first
        # on the path: `--candidate DIR` compares it with ours in one run.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [CANDIDATE["path"], os.environ.get("PYTHONPATH")]))}
        kind = "ours"
    argv += [HERE, "serve", kind, path]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)


def _await_ready(kind: str, process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    if process.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"{kind} server did not start")


def _stop_server(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ratio(numerator: float | None, denominator: float | None) -> float:
    if not numerator or not denominator:
        return float("nan")
    return numerator / denominator


def _percentile(values: list[int], fraction: float) -> float:
    """Nearest-rank percentile of sorted `values`."""
    if not values:
        return float("nan")
    rank = max(0, min(len(values) - 1, int(fraction * len(values) + 0.5) - 1))
    return float(values[rank])


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def run_scenario(servers: dict[str, subprocess.Popen[bytes]], paths: dict[str, str],
                 procs: int, threads: int, *, rounds: int, window: float, warmup: float,
                 gap: float, text: str, directory: str) -> dict[str, Any]:
    """One pool of client processes, connected to every server, calls each
    server in turn: `rounds` rounds of one `window` per server, the order
    rotated every round, so that whatever else the machine does is spread
    over all servers alike."""
    kinds = list(servers)
    plan_file = os.path.join(directory, f"plan-{procs}x{threads}.json")
    with open(plan_file, "w") as file:
        json.dump({"text": text, "threads": threads, "paths": paths}, file)
    clients = []
    for index in range(procs):
        prefix = os.path.join(directory, f"c{procs}x{threads}-{index}")
        argv = [sys.executable, HERE, "client", plan_file, prefix]
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        clients.append((process, prefix))
    for process, _ in clients:  # every connection is made before time starts
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            raise RuntimeError("a client process failed to connect")
    t = time.monotonic() + 0.05
    windows = []
    for r in range(rounds):
        order = kinds[r % len(kinds):] + kinds[: r % len(kinds)]
        for kind in order:
            start = t + (warmup if r == 0 else gap)
            windows.append((kind, start, start + window))
            t = start + window
    line = (json.dumps(windows) + "\n").encode()
    for process, _ in clients:
        assert process.stdin is not None
        process.stdin.write(line)
        process.stdin.close()
    cpu = dict.fromkeys(kinds, 0.0)
    for kind, start, end in windows:
        _sleep_until(start)
        before = _cpu_seconds(servers[kind].pid)
        _sleep_until(end)
        cpu[kind] += _cpu_seconds(servers[kind].pid) - before
    calls = dict.fromkeys(kinds, 0)
    mismatches = dict.fromkeys(kinds, 0)
    latencies = {kind: array.array("q") for kind in kinds}
    late = 0
    for process, prefix in clients:
        assert process.stdout is not None
        stdout = process.stdout.read()
        if process.wait(60) != 0:
            raise RuntimeError(f"a client process failed ({process.returncode})")
        summary = json.loads(stdout)
        late += summary.pop("late")
        for kind, figures in summary.items():
            calls[kind] += figures["calls"]
            mismatches[kind] += figures["mismatches"]
            with open(f"{prefix}-{kind}.lat", "rb") as file:
                latencies[kind].frombytes(file.read())
            os.unlink(f"{prefix}-{kind}.lat")
    timed = rounds * window
    rows = {}
    for kind in kinds:
        ordered = sorted(latencies[kind])
        rows[kind] = {
            "connections": procs * threads,
            "client_processes": procs,
            "threads_per_process": threads,
            "timed_s": timed,
            "calls": calls[kind],
            "calls_per_s": calls[kind] / timed,
            "p50_us": _percentile(ordered, 0.50) / 1000,
            "p99_us": _percentile(ordered, 0.99) / 1000,
            "server_cpu_us_per_call": cpu[kind] * 1e6 / calls[kind] if calls[kind] else None,
            "mismatched_replies": mismatches[kind],
            "late_connections": late,
        }
    return rows


Servers = dict[str, subprocess.Popen[bytes]]


def _start_all(kinds: tuple[str, ...], directory: str, *,
               profile: str | None = None) -> tuple[Servers, dict[str, str]]:
    paths = {kind: os.path.join(directory, f"{kind}.sock") for kind in kinds}
    servers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for kind in kinds:
            servers[kind] = _start_server(kind, paths[kind], profile=profile)
        for kind, process in servers.items():
            _await_ready(kind, process)
    except BaseException:
        for process in servers.values():
            _stop_server(process)
        raise
    return servers, paths


def run(*, rounds: int = 3, window: float = 1.5, warmup: float = 0.5, gap: float = 0.2,
        procs: int = 8, threads: int = 1, text: str = "hello, varlink",
        servers: tuple[str, ...] = SERVERS + REFERENCES,
        scenarios: tuple[str, ...] = ("sequential", "concurrent")) -> dict[str, Any]:
    """The scenarios against the servers; returns the figures."""
    shapes = {"sequential": (1, 1), "concurrent": (procs, threads)}
    results: dict[str, Any] = {
        "machine": machine(),
        "settings": {"rounds": rounds, "window_s": window, "warmup_s": warmup, "gap_s": gap,
                     "text": text},
        "scenarios": {},
        "ratios": {},
    }
    with tempfile.TemporaryDirectory(prefix="syntrop-bench-bus-") as directory:
        processes, paths = _start_all(servers, directory)
        try:
            for scenario in scenarios:
                p, t = shapes[scenario]
                rows = run_scenario(processes, paths, p, t, rounds=rounds, window=window,
                                    warmup=warmup, gap=gap, text=text, directory=directory)
                results["scenarios"][scenario] = rows
                if "candidate" in rows and "ours" in rows:
                    results.setdefault("candidate", {})[scenario] = {
                        "calls_per_s_over_ours":
                            rows["candidate"]["calls_per_s"] / rows["ours"]["calls_per_s"],
                        "server_cpu_per_call_over_ours":
                            (rows["candidate"]["server_cpu_us_per_call"] or 0)
                            / (rows["ours"]["server_cpu_us_per_call"] or 1),
                    }
                if not all(kind in rows for kind in SERVERS):
                    continue
                ours = rows["ours"]["calls_per_s"]
                cpu = {kind: rows[kind]["server_cpu_us_per_call"] for kind in rows}
                results["ratios"][scenario] = {
                    "ours_over_python_varlink": ours / rows["python-varlink"]["calls_per_s"],
                    "ours_over_asyncvarlink": ours / rows["asyncvarlink"]["calls_per_s"],
                    "target_over_python_varlink": TARGET_RATIO,
                    # CPU per call, theirs over ours: > 1 means ours needs less.
                    "cpu_python_varlink_over_ours": _ratio(cpu["python-varlink"], cpu["ours"]),
                    "cpu_asyncvarlink_over_ours": _ratio(cpu["asyncvarlink"], cpu["ours"]),
                }
                if "candidate" in rows:
                    mine = rows["candidate"]["calls_per_s"]
                    theirs = rows["python-varlink"]["calls_per_s"]
                    results["candidate"][scenario].update({
                        "calls_per_s_over_python_varlink": mine / theirs,
                        "cpu_python_varlink_over_candidate":
                            _ratio(cpu["python-varlink"], cpu["candidate"]),
                    })
        finally:
            for process in processes.values():
                _stop_server(process)
    return results


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": sys.version.split()[0],
        "loadavg_at_start": os.getloadavg()[0],
    }


def format_table(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"bench_bus: {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, "
             f"load average {m['loadavg_at_start']:.2f} at start; "
             f"{results['settings']['rounds']} x {results['settings']['window_s']} s "
             "timed per server and scenario, servers interleaved", ""]
    header = (f"{'scenario':<11} {'server':<15} {'conns':>5} {'calls/s':>9} "
              f"{'p50 us':>8} {'p99 us':>8} {'srv CPU us/call':>15}")
    lines.append(header)
    lines.append("-" * len(header))
    for scenario, rows in results["scenarios"].items():
        for kind, row in rows.items():
            cpu = row["server_cpu_us_per_call"]
            name = f"({kind})" if kind in REFERENCES else kind
            if kind == "candidate":
                name = "candidate"
            lines.append(
                f"{scenario:<11} {name:<15} {row['connections']:>5} {row['calls_per_s']:>9,.0f} "
                f"{row['p50_us']:>8.1f} {row['p99_us']:>8.1f} "
                f"{cpu if cpu is not None else float('nan'):>15.1f}"
            )
    lines.append("")
    for scenario, ratio in results["ratios"].items():
        verdict = "meets" if ratio["ours_over_python_varlink"] >= TARGET_RATIO else "BELOW"
        lines.append(
            f"{scenario:<11} calls/s  ours/python-varlink {ratio['ours_over_python_varlink']:.2f}x "
            f"({verdict} target {TARGET_RATIO}x)   ours/asyncvarlink "
            f"{ratio['ours_over_asyncvarlink']:.2f}x"
        )
        lines.append(
            f"{'':<11} CPU/call python-varlink/ours {ratio['cpu_python_varlink_over_ours']:.2f}x"
            f"   asyncvarlink/ours {ratio['cpu_asyncvarlink_over_ours']:.2f}x"
        )
    for scenario, ratio in results.get("candidate", {}).items():
        lines.append(f"{scenario:<11} candidate/ours: calls/s "
                     f"{ratio['calls_per_s_over_ours']:.2f}x, server CPU per call "
                     f"{ratio['server_cpu_per_call_over_ours']:.2f}x")
        if "calls_per_s_over_python_varlink" in ratio:
            lines.append(f"{'':<11} candidate/python-varlink: calls/s "
                         f"{ratio['calls_per_s_over_python_varlink']:.2f}x, CPU/call "
                         f"python-varlink/candidate "
                         f"{ratio['cpu_python_varlink_over_candidate']:.2f}x")
    if any(kind in REFERENCES for rows in results["scenarios"].values() for kind in rows):
        lines.append("(asyncio-floor) is a reference, not a Varlink server: asyncio + recv + "
                     "json + send, nothing validated")
    problems = [f"{s}/{k}: {row['mismatched_replies']} mismatched replies, "
                f"{row['late_connections']} connections late to the first window"
                for s, rows in results["scenarios"].items() for k, row in rows.items()
                if row["mismatched_replies"] or row["late_connections"]]
    lines.extend(f"warning: {problem}" for problem in problems)
    return "\n".join(lines)


INPROCESS = r"""
import asyncio, json, socket, sys, time
sys.path.insert(0, sys.argv[1])
import bench_bus
from syntrop.varlink.server import Server

async def main():
    server = Server([bench_bus._ours_service()])
    a, b = socket.socketpair()
    conn = server.add_connection(b)
    # Drive the connection by hand (private API): no epoll, no second process.
    server.loop.remove_reader(conn.fd)
    conn.reading = False
    message = json.dumps({"method": bench_bus.METHOD,
                          "parameters": {"text": "hello, varlink"}}).encode() + b"\0"
    def calls(n):
        for _ in range(n):
            a.send(message)
            conn._on_readable()
            a.recv(65536)
    calls(2000)
    results = []
    for _ in range(5):
        t = time.process_time()
        calls(10000)
        results.append((time.process_time() - t) / 10000 * 1e6)
    print(json.dumps({"us_per_call_min": min(results), "us_per_call_all": results,
                      "server_module": sys.modules["syntrop.varlink.server"].__file__}))
asyncio.run(main())
"""


def inprocess(candidate: str | None) -> dict[str, Any]:
    """CPU microseconds per Echo call through our connection code alone
    (socketpair, the read handler called directly), least of 5 x 10,000.
    Includes the client's send and recv; excludes the event loop and the
    other process, so it moves least with the machine's load."""
    results = {}
    for name, path in (("ours", None), ("candidate", candidate)):
        if name == "candidate" and not path:
            continue
        env = dict(os.environ)
        if path:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
        done = subprocess.run([sys.executable, "-c", INPROCESS, os.path.dirname(HERE)],
                              env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"in-process run failed (server internals changed?):\n"
                               f"{done.stderr}")
        results[name] = json.loads(done.stdout)
    return results


def profile(*, rounds: int, window: float, warmup: float, top: int = 25) -> str:
    """Run our server under cProfile with the sequential client; the report."""
    import io
    import pstats

    with tempfile.TemporaryDirectory(prefix="syntrop-bench-prof-") as directory:
        stats_file = os.path.join(directory, "ours.prof")
        processes, paths = _start_all(("ours",), directory, profile=stats_file)
        try:
            row = run_scenario(processes, paths, 1, 1, rounds=rounds, window=window,
                               warmup=warmup, gap=0.2, text="hello, varlink",
                               directory=directory)["ours"]
        finally:
            for process in processes.values():
                _stop_server(process)
        stream = io.StringIO()
        stats = pstats.Stats(stats_file, stream=stream)
        stats.strip_dirs().sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
    head = (f"ours under cProfile, sequential: {row['calls']} calls, "
            f"{row['calls_per_s']:,.0f} calls/s (profiler overhead included)\n")
    return head + stream.getvalue()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve(argv[1], argv[2])
        return
    if argv[:1] == ["client"]:
        client(argv[1], argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed windows per server and scenario, interleaved (default 3)")
    parser.add_argument("--window", type=float, default=1.5,
                        help="seconds per timed window (default 1.5)")
    parser.add_argument("--warmup", type=float, default=0.5,
                        help="untimed seconds of calls before a server's first window "
                        "(default 0.5; 0.2 s before later ones)")
    parser.add_argument("--procs", type=int, default=8,
                        help="client processes in the concurrent scenario (default 8)")
    parser.add_argument("--threads", type=int, default=1,
                        help="connections (threads) per client process there (default 1)")
    parser.add_argument("--servers", default=",".join(SERVERS + REFERENCES),
                        help="comma-separated subset of: " + ", ".join(SERVERS + REFERENCES))
    parser.add_argument("--scenarios", default="sequential,concurrent",
                        help="comma-separated subset of: sequential, concurrent")
    parser.add_argument("--candidate", metavar="DIR",
                        help="also serve our server from DIR/syntrop (a changed copy of src/) "
                        "as 'candidate', to measure a change against ours in the same run")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--profile", action="store_true",
                        help="profile our server under the sequential load instead")
    parser.add_argument("--inprocess", action="store_true",
                        help="instead: CPU per call of our connection code alone (and of "
                        "--candidate), driven in one process; least moved by machine load")
    args = parser.parse_args(argv)
    servers = tuple(args.servers.split(","))
    if args.candidate:
        CANDIDATE["path"] = os.path.abspath(args.candidate)
        servers += ("candidate",)
    if args.inprocess:
        figures = inprocess(CANDIDATE["path"])
        if args.json:
            json.dump(figures, sys.stdout, indent=2)
            sys.stdout.write("\n")
        for name, row in figures.items():
            if not args.json:
                print(f"{name:<10} {row['us_per_call_min']:6.1f} us CPU per call, in-process "
                      f"({row['server_module']})")
        return
    if args.profile:
        print(profile(rounds=args.rounds, window=args.window, warmup=args.warmup))
        return
    results = run(rounds=args.rounds, window=args.window, warmup=args.warmup,
                  procs=args.procs, threads=args.threads,
                  servers=servers,
                  scenarios=tuple(args.scenarios.split(",")))
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(results))


if __name__ == "__main__":
    main()
