"""contextd: change latency, GetUnitContext on a full ring, journal slices.

Each figure is printed next to a baseline measured in the same run:

- file write → event visible through ListEvents over Varlink (target p99
  <= 50 ms) vs. a raw inotify read in this process (the kernel's floor:
  write, then the inotify fd becomes readable);
- GetUnitContext p99 with 100,000 events in the ring, journal off (target
  p99 <= 20 ms) vs. a GetStatus round trip on the same daemon (the bus
  floor) and vs. a linear scan of the same 100,000 records in this process
  (what an unindexed timeline would cost); and the same call with the journal
  slice on;
- the journal slice on a journal and on one 10x larger (roughly constant is
  the target) vs. `journalctl --file … --unit … -n 40` on the same files.

Run: .venv/bin/python bench/bench_contextd.py [--json] [--quick]
"""

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import activated  # noqa: E402

from bench.wire import Wire  # noqa: E402
from syntrop.contextd import journal as slices  # noqa: E402
from syntrop.contextd.store import Batch, Store  # noqa: E402
from syntrop.contextd.timeline import Record  # noqa: E402
from syntrop.system import inotify as ino  # noqa: E402
from syntrop.system import journal as journalctl  # noqa: E402

S = 1_000_000
NAME = "io.syntrop.Context1"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(values, 0.5) * 1000, 3),
            "p99_ms": round(percentile(values, 0.99) * 1000, 3),
            "mean_ms": round(statistics.fmean(values) * 1000, 3), "n": len(values)}


def configure(root: Path, units: Path, **journal: Any) -> None:
    lines = [f'unit_dirs = ["{units}"]', f'reference_prefixes = ["{root}/"]',
             "[packages]", 'dpkg_log = ""', 'apt_history = ""', 'dnf_log = ""', "[journal]"]
    journal.setdefault("journalctl", "")
    for key, value in journal.items():
        lines.append(f"{key} = {json.dumps(value)}")
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "contextd.toml").write_text("\n".join(lines) + "\n")


def connect(daemon_socket: Path) -> Wire:
    deadline = time.monotonic() + 10
    while True:
        try:
            return Wire(daemon_socket)
        except (ConnectionRefusedError, FileNotFoundError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


# 1. file write → visible -------------------------------------------------------


def bench_latency(scratch: Path, rounds: int) -> dict[str, Any]:
    root = scratch / "latency"
    units = root / "system"
    units.mkdir(parents=True)
    target = units / "bench.service"
    target.write_text("[Unit]\n")
    configure(root, units)
    # Baseline: a raw inotify watch in this process, write → readable.
    raw = ino.Inotify()
    raw.add_watch(str(units), ino.CLOSE_WRITE)
    floor = []
    for i in range(rounds):
        started = time.perf_counter()
        target.write_text(f"[Unit]\nDescription=raw {i}\n")
        select.select([raw.fd], [], [], 5)
        floor.append(time.perf_counter() - started)
        raw.read()
    raw.close()
    visible = []
    with activated("contextd", root) as daemon:
        wire = connect(daemon.socket)
        wire.call("io.syntrop.Context1.GetStatus")
        last = 0
        for i in range(rounds):
            started = time.perf_counter()
            target.write_text(f"[Unit]\nDescription=round {i}\n")
            while True:
                found = [e for e in wire.call(f"{NAME}.ListEvents", after_id=last)["events"]
                         if e.get("path") == str(target)]
                if found:
                    last = found[-1]["id"]
                    break
                if time.perf_counter() - started > 5:
                    raise RuntimeError("event not visible within 5 s")
            visible.append(time.perf_counter() - started)
            time.sleep(0.005)
        dropped = wire.call(f"{NAME}.GetStatus")["dropped_events"]
        wire.close()
    return {"contextd": summary(visible), "baseline_raw_inotify": summary(floor),
            "dropped": dropped}


# 2. GetUnitContext with 100,000 events ----------------------------------------


def fill(root: Path, units: Path, count: int, unit_count: int) -> None:
    """Write `count` events spread over `unit_count` units (drop-ins, unit
    files, packages, kernel) straight into contextd's store."""
    store = Store(root / "state" / "contextd" / "contextd.db")
    now = time.time_ns() // 1000
    batch = Batch()
    for i in range(1, count + 1):
        unit = f"u{i % unit_count}.service"
        ts = now - (count - i) * 1000
        kind = ("dropin", "unit_file", "package", "kernel")[(i // unit_count) % 4]
        if kind == "package":
            keys: tuple[str, ...] = ("package", f"pkg:p{i % 500}", f"spec:p{i % 500}:amd64")
        elif kind == "kernel":
            keys = ("kernel", f"kernel:pid:{i}") if i % 40 == 0 else (f"kernel:pid:{i}",)
        else:
            keys = (f"unit:{unit}",)
        path = f"{units}/{unit}.d/{i % 7}.conf" if kind == "dropin" else f"{units}/{unit}"
        batch.events.append((Record(
            id=i, timestamp_usec=ts, kind=kind, action="modified",
            summary=f"{kind} {path} modified: +1 -1 lines: +Environment=N={i}", unit=unit,
            path=path, has_diff=kind != "kernel", keys=keys),
            f"--- a{path}\n+++ b{path}\n@@ -1 +1 @@\n-Environment=N={i - 1}\n+Environment=N={i}\n"))
    store.write_now(batch)
    store.close()


def bench_context(scratch: Path, count: int, calls: int,
                  journal_dir: Path | None) -> dict[str, Any]:
    root = scratch / "context"
    units = root / "system"
    units.mkdir(parents=True)
    unit_count = 1000
    for i in range(0, unit_count, 100):
        (units / f"u{i}.service").write_text("[Service]\nExecStart=/usr/bin/true\n")
    started = time.perf_counter()
    fill(root, units, count, unit_count)
    filled = time.perf_counter() - started
    result: dict[str, Any] = {"events": count, "fill_s": round(filled, 2)}
    configure(root, units)
    with activated("contextd", root) as daemon:
        started = time.perf_counter()
        wire = connect(daemon.socket)
        status = wire.call(f"{NAME}.GetStatus")
        result["start_with_full_ring_s"] = round(time.perf_counter() - started, 2)
        assert status["events"] == count, status
        bus, context = [], []
        for i in range(calls):
            t0 = time.perf_counter()
            wire.call(f"{NAME}.GetStatus")
            t1 = time.perf_counter()
            answer = wire.call(f"{NAME}.GetUnitContext", unit=f"u{(i * 37) % unit_count}.service")
            context.append(time.perf_counter() - t1)
            bus.append(t1 - t0)
        result["events_per_answer"] = len(answer["events"])
        result["get_unit_context"] = summary(context)
        result["baseline_getstatus_round_trip"] = summary(bus)
        wire.close()
    # Baseline: an unindexed timeline, scanning every record for the unit.
    records = [(f"unit:u{i % unit_count}.service", i) for i in range(count)]
    scans = []
    for i in range(min(calls, 50)):
        wanted = f"unit:u{(i * 37) % unit_count}.service"
        t0 = time.perf_counter()
        hits = [r for r in records if r[0] == wanted]
        scans.append(time.perf_counter() - t0)
        assert hits
    result["baseline_linear_scan_in_process"] = summary(scans)
    if journal_dir is not None:
        configure(root, units, journalctl="journalctl", directory=str(journal_dir), kernel=False)
        with activated("contextd", root) as daemon:
            wire = connect(daemon.socket)
            wire.call(f"{NAME}.GetStatus")  # started (loading the ring) before timing
            t0 = time.perf_counter()
            wire.call(f"{NAME}.GetUnitContext", unit="web.service")
            result["get_unit_context_with_journal_slice_cold_ms"] = round(
                (time.perf_counter() - t0) * 1000, 1)
            with_journal = []
            for _ in range(max(20, calls // 10)):
                t0 = time.perf_counter()
                wire.call(f"{NAME}.GetUnitContext", unit="web.service")
                with_journal.append(time.perf_counter() - t0)
            wire.close()
        result["get_unit_context_with_journal_slice"] = summary(with_journal)
    return result


# 3. journal slices, 1x and 10x ----------------------------------------------


def journal_remote() -> str:
    for candidate in (shutil.which("systemd-journal-remote"), "/lib/systemd/systemd-journal-remote",
                      "/usr/lib/systemd/systemd-journal-remote"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError("systemd-journal-remote is missing (Debian: systemd-journal-remote)")


def make_journal(directory: Path, entries: int, start: int) -> tuple[list[Path], int]:
    """A journal of `entries` lines, 1 in 50 from web.service, a failure of
    web.service in the middle: its files (systemd-journal-remote rotates past
    its size limit, as journald does) and the failure's time."""
    directory.mkdir(parents=True)
    source = directory / "input.export"
    failure = start + (entries // 2) * 1000
    with source.open("w") as out:
        for i in range(entries):
            ts = start + i * 1000
            unit = "web.service" if i % 50 == 0 else f"noise{i % 20}.service"
            out.write(f"__REALTIME_TIMESTAMP={ts}\n__MONOTONIC_TIMESTAMP={ts % 10**12}\n"
                      "_BOOT_ID=0123456789abcdef0123456789abcdef\n_HOSTNAME=bench\n"
                      f"_SYSTEMD_UNIT={unit}\n_PID={1000 + i % 20}\nPRIORITY=6\n"
                      f"MESSAGE=line {i} of {unit} with some text to look like a log line\n\n")
            if ts <= failure < ts + 1000:
                out.write(f"__REALTIME_TIMESTAMP={failure}\n__MONOTONIC_TIMESTAMP={failure}\n"
                          "_BOOT_ID=0123456789abcdef0123456789abcdef\n_PID=1\nUNIT=web.service\n"
                          "_SYSTEMD_UNIT=init.scope\nPRIORITY=4\n"
                          "MESSAGE_ID=d9b373ed55a64feb8242e02dbe79a49c\nUNIT_RESULT=exit-code\n"
                          "MESSAGE=web.service: Failed with result 'exit-code'.\n\n")
    path = directory / "remote.journal"
    subprocess.run([journal_remote(), f"--output={path}", str(source)], check=True,
                   capture_output=True, timeout=600)
    source.unlink()
    return sorted(directory.glob("*.journal")), failure


def bench_slices(scratch: Path, small: int, rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    start = time.time_ns() // 1000 - 3600 * S
    for label, count in (("1x", small), ("10x", small * 10)):
        t0 = time.perf_counter()
        paths, failure = make_journal(scratch / f"journal-{label}", count, start)
        made = time.perf_counter() - t0
        source = journalctl.Source(files=tuple(str(p) for p in paths))
        read = lambda argv, limit: journalctl.read(argv, limit=limit)  # noqa: E731
        ours, baseline, found = [], [], 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            piece = slices.slice_unit(source, read, "web.service", failure_usec=failure,
                                      invocation_id=None, before=40, after=20,
                                      after_usec=30 * S, now_usec=time.time_ns() // 1000)
            ours.append(time.perf_counter() - t0)
            found = len(piece.lines)
            t0 = time.perf_counter()
            subprocess.run(["journalctl", *(f"--file={p}" for p in paths), "--unit=web.service",
                            "-n", "40", "--output=json", "--no-pager"], check=True,
                           capture_output=True)
            baseline.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        unknown = slices.slice_unit(source, read, "web.service", failure_usec=None,
                                    invocation_id=None, before=40, after=20, after_usec=30 * S,
                                    now_usec=time.time_ns() // 1000)
        scan = time.perf_counter() - t0
        assert unknown.failure_usec >= failure
        result[label] = {
            "entries": count, "files": len(paths),
            "journal_bytes": sum(p.stat().st_size for p in paths), "made_s": round(made, 1),
            "lines": found, "slice_at_failure_time": summary(ours),
            "slice_failure_unknown_ms": round(scan * 1000, 2),
            "baseline_journalctl_n40": summary(baseline),
        }
    ratio = result["10x"]["slice_at_failure_time"]["p50_ms"] / \
        result["1x"]["slice_at_failure_time"]["p50_ms"]
    result["slice_p50_ratio_10x_over_1x"] = round(ratio, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    rounds = 50 if args.quick else 300
    with tempfile.TemporaryDirectory(prefix="syntrop-bench-contextd-") as scratch_name:
        scratch = Path(scratch_name)
        journal_small = 2_000 if args.quick else 20_000
        results: dict[str, Any] = {
            "latency": bench_latency(scratch, rounds),
            "journal": bench_slices(scratch, journal_small, 10 if args.quick else 30),
        }
        results["context"] = bench_context(
            scratch, 10_000 if args.quick else 100_000, 100 if args.quick else 500,
            scratch / "journal-10x")
    if args.json:
        print(json.dumps(results, indent=2))
        return
    lat = results["latency"]
    print("file write -> event visible via Varlink (ListEvents)")
    print(f"  contextd          p50 {lat['contextd']['p50_ms']:7.2f} ms  "
          f"p99 {lat['contextd']['p99_ms']:7.2f} ms  (target p99 <= 50 ms)")
    print(f"  raw inotify read  p50 {lat['baseline_raw_inotify']['p50_ms']:7.2f} ms  "
          f"p99 {lat['baseline_raw_inotify']['p99_ms']:7.2f} ms  (baseline, in-process)")
    ctx = results["context"]
    print(f"GetUnitContext with {ctx['events']:,} events in the ring "
          f"({ctx['events_per_answer']} events per answer; "
          f"start {ctx['start_with_full_ring_s']} s)")
    print(f"  GetUnitContext    p50 {ctx['get_unit_context']['p50_ms']:7.2f} ms  "
          f"p99 {ctx['get_unit_context']['p99_ms']:7.2f} ms  (target p99 <= 20 ms, journal off)")
    print(f"  GetStatus         p50 {ctx['baseline_getstatus_round_trip']['p50_ms']:7.2f} ms  "
          f"p99 {ctx['baseline_getstatus_round_trip']['p99_ms']:7.2f} ms  (baseline: bus floor)")
    print(f"  linear scan       p50 {ctx['baseline_linear_scan_in_process']['p50_ms']:7.2f} ms  "
          f"p99 {ctx['baseline_linear_scan_in_process']['p99_ms']:7.2f} ms  "
          "(baseline: unindexed, in-process)")
    if "get_unit_context_with_journal_slice" in ctx:
        j = ctx["get_unit_context_with_journal_slice"]
        print(f"  with journal slice p50 {j['p50_ms']:6.2f} ms  p99 {j['p99_ms']:7.2f} ms  "
              f"(first call: {ctx['get_unit_context_with_journal_slice_cold_ms']} ms)")
    jr = results["journal"]
    print("journal slice at the failure time (40 before, 20 after)")
    for label in ("1x", "10x"):
        r = jr[label]
        print(f"  {label:3} {r['entries']:>9,} entries {r['files']} files "
              f"{r['journal_bytes'] >> 20:4} MiB  slice "
              f"p50 {r['slice_at_failure_time']['p50_ms']:6.2f} ms p99 "
              f"{r['slice_at_failure_time']['p99_ms']:6.2f} ms | journalctl -u -n 40 p50 "
              f"{r['baseline_journalctl_n40']['p50_ms']:6.2f} ms | failure unknown "
              f"{r['slice_failure_unknown_ms']:6.2f} ms")
    print(f"  10x / 1x slice time: {jr['slice_p50_ratio_10x_over_1x']}")


if __name__ == "__main__":
    main()
