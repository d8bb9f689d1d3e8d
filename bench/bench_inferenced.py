"""inferenced: durable lease throughput, freeze latency, gang placement.

Each figure is printed next to a baseline measured in the same run:

- acquire+release pairs/s over Varlink (1 client, 8 concurrent clients)
  vs. the bare durable floor: the same two SQLite transactions (insert,
  delete) in WAL mode with no daemon in between;
- freeze latency of a real process's cgroup, from sending the EmergencyTriage
  AcquireLease that preempts it to the cgroup reporting "frozen 1", vs. a
  direct write to cgroup.freeze and wait in this process (target p99 <= 25 ms;
  the seed allows 250 ms; needs root and a writable cgroup2 mount);
- placement of a 4-of-8 gang on a fake 8-GPU, 4-switch, 2-NUMA topology
  vs. first-fit (time, and the cost of the chosen set).

Run: .venv/bin/python bench/bench_inferenced.py [--json]
"""

import argparse
import contextlib
import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import fakesysfs  # noqa: E402
from tests.support import activated  # noqa: E402

from bench.wire import Wire  # noqa: E402
from syntrop.inferenced.topology import choose, distance, scan  # noqa: E402
from syntrop.system import cgroup  # noqa: E402

GiB = 1 << 30


M = "io.syntrop.Inference1."


def _lease_client(path: Path, seconds: float, start: Any, counts: Any, index: int) -> None:
    wire = Wire(path)
    pid = os.getpid()
    start.wait()
    stop, count = time.monotonic() + seconds, 0
    while time.monotonic() < stop:
        lease = wire.call(M + "AcquireLease", priority="Interactive", memory_bytes=1 << 20,
                          plane="cpu", unit=None, pid=pid)
        wire.call(M + "ReleaseLease", lease_id=lease["lease_id"])
        count += 1
    counts[index] = count
    wire.close()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lease_pairs(path: Path, seconds: float, clients: int, daemon_pid: int
                ) -> tuple[float, float]:
    """Pairs/s from `clients` client processes, one connection each
    (processes, as in bench_bus: no client GIL between a reply and the next
    call), each leasing for its own pid; and the daemon's CPU per pair (µs),
    the figure least moved by what else the machine runs."""
    cpu_before = _cpu_seconds(daemon_pid)
    context = multiprocessing.get_context("fork")
    start = context.Barrier(clients + 1)
    counts = context.Array("l", clients)
    workers = [context.Process(target=_lease_client, args=(path, seconds, start, counts, i))
               for i in range(clients)]
    for worker in workers:
        worker.start()
    start.wait()
    started = time.monotonic()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    if any(worker.exitcode for worker in workers):
        raise RuntimeError("a lease client failed")
    pairs = sum(int(count) for count in counts[:])
    return pairs / elapsed, (_cpu_seconds(daemon_pid) - cpu_before) / max(pairs, 1) * 1e6


def sqlite_pairs(directory: Path, seconds: float) -> tuple[float, float]:
    connection = sqlite3.connect(directory / "floor.db", isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("CREATE TABLE leases (id TEXT PRIMARY KEY, plane TEXT, memory INTEGER)")
    count, stop = 0, time.monotonic() + seconds
    started, cpu_before = time.monotonic(), time.process_time()
    while time.monotonic() < stop:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("INSERT INTO leases VALUES (?, 'cpu', 1)", (str(count),))
        connection.execute("COMMIT")
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("DELETE FROM leases WHERE id = ?", (str(count),))
        connection.execute("COMMIT")
        count += 1
    rate = count / (time.monotonic() - started)
    cpu = (time.process_time() - cpu_before) / max(count, 1) * 1e6
    connection.close()
    return rate, cpu


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def freeze_latency(path: Path, samples: int) -> dict[str, Any] | None:
    mount = cgroup.find_mount()
    if mount is None or os.geteuid() != 0:
        return None
    sandbox = mount / f"syntrop-bench-{os.getpid()}"
    victim = sandbox / "victim"
    try:
        victim.mkdir(parents=True)
    except OSError:
        return None
    process = subprocess.Popen(["sleep", "600"])
    via_daemon: list[float] = []
    direct: list[float] = []
    try:
        (victim / "cgroup.procs").write_text(str(process.pid))
        wire = Wire(path)
        total = wire.call(M + "GetTopology")["total_ram"]
        for _ in range(samples):
            batch = wire.call(M + "AcquireLease", priority="Batch", memory_bytes=total * 3 // 4,
                              plane="cpu", unit=None, pid=process.pid)
            started = time.monotonic()
            emergency = wire.call(M + "AcquireLease", priority="EmergencyTriage",
                                  memory_bytes=total // 2, plane="cpu", unit=None,
                                  pid=os.getpid())
            if not cgroup.is_frozen(victim):
                raise RuntimeError("victim not frozen when the reply came")
            via_daemon.append(time.monotonic() - started)
            wire.call(M + "ReleaseLease", lease_id=emergency["lease_id"])
            wire.call(M + "ReleaseLease", lease_id=batch["lease_id"])
        for _ in range(samples):
            started = time.monotonic()
            cgroup.set_frozen(victim, True)
            direct.append(time.monotonic() - started)
            cgroup.set_frozen(victim, False)
        wire.close()
    finally:
        with contextlib.suppress(cgroup.CgroupError):
            cgroup.set_frozen(victim, False)
        process.kill()
        process.wait()
        for directory in (victim, sandbox):
            for _ in range(100):
                try:
                    directory.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
    return {
        "samples": samples,
        "acquire_to_frozen_p50_ms": percentile(via_daemon, 50) * 1000,
        "acquire_to_frozen_p99_ms": percentile(via_daemon, 99) * 1000,
        "direct_freeze_p50_ms": percentile(direct, 50) * 1000,
        "direct_freeze_p99_ms": percentile(direct, 99) * 1000,
    }


def eight_gpu_box(root: Path) -> Path:
    gpus = []
    for switch in range(4):
        numa = switch // 2
        rc = "pci0000:00" if numa == 0 else "pci0000:80"
        bus = 0x10 * (switch + 1)
        for slot in range(2):
            path = (f"{rc}/0000:{rc[-2:]}:0{switch + 1}.0/0000:{bus:02x}:00.0/"
                    f"0000:{bus + 1:02x}:0{slot}.0/0000:{bus + 2 + slot:02x}:00.0")
            gpus.append(fakesysfs.Gpu(f"renderD{128 + switch * 2 + slot}", path, "0x1002",
                                      "0x740f", "amdgpu", numa=numa, vram_total=64 * GiB))
    return fakesysfs.build(root, gpus, numa=["10 21", "21 10"])


def placement(directory: Path, rounds: int) -> dict[str, Any]:
    topology = scan(eight_gpu_box(directory / "tree"))
    gpus = [p for p in topology.planes if p.kind == "drm_gpu"]
    numa = topology.numa_distances

    def cost(chosen: list[Any]) -> int:
        return sum(distance(a, b, numa) for i, a in enumerate(chosen) for b in chosen[i + 1:])

    # Interleave the candidates (as a fragmented node would list them) so
    # first-fit has something to get wrong.
    interleaved = sorted(gpus, key=lambda p: (p.id[-1], p.id))
    started = time.perf_counter()
    for _ in range(rounds):
        ours = choose(interleaved, 4, numa, pipeline=False)
    ours_time = (time.perf_counter() - started) / rounds
    started = time.perf_counter()
    for _ in range(rounds):
        first_fit = interleaved[:4]
    first_time = (time.perf_counter() - started) / rounds
    assert ours is not None
    return {
        "ours_ms": ours_time * 1000,
        "ours_cost": cost(ours),
        "ours_planes": [p.id for p in ours],
        "first_fit_ms": first_time * 1000,
        "first_fit_cost": cost(first_fit),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        (directory / "config").mkdir()
        with activated("inferenced", directory) as daemon:
            pid = daemon.process.pid  # setpriv and socket-activate exec into the daemon
            lease_pairs(daemon.socket, 0.5, 1, pid)  # warm-up: first-use imports, the store
            for clients in (1, 8):
                rate, cpu = lease_pairs(daemon.socket, args.seconds, clients, pid)
                results[f"lease_pairs_per_s_{clients}"] = rate
                results[f"lease_cpu_us_per_pair_{clients}"] = cpu
            results["freeze"] = freeze_latency(daemon.socket, 30)
        results["sqlite_pairs_per_s"], results["sqlite_cpu_us_per_pair"] = sqlite_pairs(
            directory, args.seconds)
        results["placement"] = placement(directory, 200)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    floor = results["sqlite_pairs_per_s"]
    print("inferenced benchmarks")
    for clients in (1, 8):
        print(f"  acquire+release, {clients} client{'s' if clients > 1 else ' '}    "
              f"{results[f'lease_pairs_per_s_{clients}']:9.0f} pairs/s, "
              f"{results[f'lease_cpu_us_per_pair_{clients}']:5.0f} us of inferenced's CPU a pair")
    print(f"  baseline: bare SQLite pairs   {floor:9.0f} pairs/s, "
          f"{results['sqlite_cpu_us_per_pair']:5.0f} us of CPU a pair "
          "(same WAL settings, no daemon)")
    freeze = results["freeze"]
    if freeze is None:
        print("  freeze latency: skipped (needs root and a writable cgroup2 mount)")
    else:
        print(f"  acquire -> cgroup frozen      p50 {freeze['acquire_to_frozen_p50_ms']:6.2f} ms"
              f"  p99 {freeze['acquire_to_frozen_p99_ms']:6.2f} ms  (target p99 <= 25 ms)")
        print(f"  baseline: direct freeze       p50 {freeze['direct_freeze_p50_ms']:6.2f} ms"
              f"  p99 {freeze['direct_freeze_p99_ms']:6.2f} ms")
    place = results["placement"]
    print(f"  4-of-8 gang placement         {place['ours_ms']:6.3f} ms, set cost "
          f"{place['ours_cost']} ({', '.join(place['ours_planes'])})")
    print(f"  baseline: first fit           {place['first_fit_ms']:6.3f} ms, set cost "
          f"{place['first_fit_cost']}")


if __name__ == "__main__":
    main()
