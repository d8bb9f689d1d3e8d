"""modeld: pull throughput and import cost, each next to a baseline measured
in the same run.

- Pull of a ~100 MB GGUF over loopback (Hugging Face layout, a real HTTP
  server in this process using sendfile) through the real `syn pull` and a
  socket-activated modeld: bytes fetched by syn, piped to modeld, hashed in
  flight, written, fsync'd, verified, linked and registered. Baseline:
  `sha256sum` of the same file (the CPU-bound limit the issue names; target
  >= 0.8x). The transfer is timed inside syn's own pull code, from modeld's
  first "receiving" reply to the registered model; the whole `syn pull`
  command is timed too, and one that has nothing to fetch (the same blob
  under a second name: start-up, resolve, Varlink). Python's hashlib (OpenSSL) is shown
  too: coreutils' sha256sum on Debian 12 does not use the CPU's SHA
  extensions, hashlib does.
- Import of an existing 100 MB file (Model1.Register of a path): on ext4 a
  copy_file_range copy + hash of the copy; on a loop-mounted XFS (root and
  mkfs.xfs) a reflink + hash; a second name for a stored blob (Pull with a
  known digest: a hard link in the by-name tree, no bytes). Baselines: a
  full copy (`cp --reflink=never`) and a full copy + hash in Python.

Run: .venv/bin/python bench/bench_modeld.py [--json] [--size MB]
"""

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.unit.modeld import xfs  # noqa: E402
from tests.unit.modeld.ggufs import write_tiny  # noqa: E402
from tests.unit.modeld.harness import Store, modeld  # noqa: E402
from tests.unit.modeld.registry import serving  # noqa: E402

RUNS = 3


def median(function: Callable[[], float], runs: int = RUNS) -> float:
    return statistics.median(function() for _ in range(runs))


def timed(function: Callable[[], object]) -> float:
    os.sync()  # every run starts with no writeback pending
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def sha256sum(path: Path) -> float:
    return timed(lambda: subprocess.run(["sha256sum", str(path)], check=True,
                                        capture_output=True))


def hashlib_file(path: Path) -> float:
    def run() -> None:
        digest = hashlib.sha256()
        with path.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)

    return timed(run)


def copy_and_hash(source: Path, target: Path) -> float:
    def run() -> None:
        digest = hashlib.sha256()
        with source.open("rb") as src, target.open("wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())

    try:
        return timed(run)
    finally:
        target.unlink()


def cp(source: Path, target: Path) -> float:
    """cp, then fsync of the copy (as the store makes its blobs durable)."""
    try:
        return timed(lambda: subprocess.run(
            f"cp --reflink=never '{source}' '{target}' && sync '{target}'", shell=True,
            check=True))
    finally:
        target.unlink()


def pull(store: Store, name: str) -> float:
    def run() -> None:
        result = store.syn("pull", "hf://bench/Big-GGUF/big.gguf", "--name", name, "--json",
                           timeout=300)
        assert result.returncode == 0, result.stderr

    return timed(run)


class _Clock:
    """A Display for syn's pull code that notes when the bytes start to flow."""

    def __init__(self) -> None:
        self.receiving: float | None = None

    def line(self, text: str) -> None:
        pass

    def phase(self, phase: str, done: int, total: int | None) -> None:
        if phase == "receiving" and self.receiving is None:
            self.receiving = time.perf_counter()

    def add(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def transfer(store: Store, name: str) -> float:
    """syn pull's own code in this process: seconds from modeld's first
    "receiving" reply to the registered model (GET, pipe, hash, write,
    fsync, verify, link, commit)."""
    import argparse

    from syntrop.cli import pulling
    from syntrop.modeld import refs

    reference = "hf://bench/Big-GGUF/big.gguf"
    args = argparse.Namespace(reference=reference, name=name, sha256=None, insecure=False,
                              retries=0, json=True, pin=False)
    clock = _Clock()
    saved = {k: os.environ.get(k) for k in ("RUNTIME_DIRECTORY", "CONFIGURATION_DIRECTORY")}
    os.environ.update({k: v for k, v in store.env().items() if k in saved})
    try:
        os.sync()
        pulling._pull_remote(refs.parse(reference), args, clock)  # type: ignore[arg-type]
        done = time.perf_counter()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert clock.receiving is not None
    return done - clock.receiving


def bench_pull(work: Path, model: Path) -> dict[str, Any]:
    size = model.stat().st_size
    runs = 5
    with serving(work / "srv") as registry:
        registry.add_hf("bench/Big-GGUF", "big.gguf", model)
        with modeld(work / "pull", pull=f'[hf]\nendpoint = "{registry.url}"\n') as store:
            def fresh(measure: Callable[[Store, str], float]) -> float:
                took = measure(store, "big")
                store.call("Remove", name="big")  # the blob goes: the next pull fetches it
                return took

            baselines, transfers, commands = [], [], []
            for _ in range(runs):  # interleaved, so drifts of the machine hit all three
                baselines.append(sha256sum(model))
                transfers.append(fresh(transfer))
                commands.append(fresh(pull))
            pull(store, "big")
            fixed = median(lambda: pull(store, "alias"), runs)
    baseline, net, full = (statistics.median(x) for x in (baselines, transfers, commands))
    openssl = median(lambda: hashlib_file(model))
    mb = size / 1e6
    return {
        "bytes": size, "runs": runs,
        "sha256sum_s": baseline, "sha256sum_MBps": mb / baseline,
        "sha256sum_all_s": baselines,
        "hashlib_s": openssl, "hashlib_MBps": mb / openssl,
        "pull_s": full, "pull_MBps": mb / full,
        "fixed_cost_s": fixed,
        "transfer_s": net, "transfer_MBps": mb / net, "transfer_all_s": transfers,
        "ratio_end_to_end": baseline / full,
        "ratio_transfer": baseline / net,
    }


def register(store: Store, path: Path, name: str) -> float:
    try:
        return timed(lambda: store.call("Register", name=name, path=str(path)))
    finally:
        store.call("Remove", name=name)


def bench_import(work: Path, model: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with modeld(work / "import") as store:
        results["ext4_register_s"] = median(lambda: register(store, model, "imported"))
        results["full_copy_cp_s"] = median(lambda: cp(model, work / "copy"))
        results["full_copy_and_hash_s"] = median(lambda: copy_and_hash(model, work / "copy"))
    reason = xfs.unavailable()
    if reason is None:
        with contextlib.ExitStack() as stack:
            mount = stack.enter_context(_xfs(work))
            source = mount / "model.gguf"
            shutil.copy(model, source)
            config = f'[store]\ndirectory = "{mount}/store"\n'
            store = stack.enter_context(modeld(work / "xfs-root", config=config))
            results["xfs_reflink_register_s"] = median(lambda: register(store, source, "r"))
            results["xfs_full_copy_cp_s"] = median(lambda: cp(source, mount / "copy"))
    else:
        results["xfs_skipped"] = reason
    with serving(work / "srv2") as registry:
        registry.add_hf("bench/Big-GGUF", "big.gguf", model)
        with modeld(work / "dedup", pull=f'[hf]\nendpoint = "{registry.url}"\n') as store:
            pull(store, "first")
            results["second_name_pull_s"] = median(lambda: pull(store, "second"))
            digest = _sha(model)
            results["second_name_register_s"] = median(
                lambda: timed(lambda: store.call_more(
                    "Pull", reference="hf://bench/Big-GGUF/big.gguf", name="third",
                    sha256=digest)))
    return results


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _xfs(work: Path) -> Iterator[Path]:
    import pytest

    try:
        with xfs.mounted(work) as mount:
            yield mount
    except pytest.skip.Exception as skip:
        raise RuntimeError(str(skip)) from None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--size", type=int, default=100, help="model size in MB (default 100)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as directory:
        work = Path(directory)
        model = work / "big.gguf"
        write_tiny(model, floats=args.size * 250_000)
        results = {"pull": bench_pull(work, model), "import": bench_import(work, model)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    p, i = results["pull"], results["import"]
    print(f"modeld pull of {p['bytes'] / 1e6:.0f} MB over loopback (median of {p['runs']}):")
    print(f"  sha256sum (baseline)         {p['sha256sum_s']:.3f} s  "
          f"{p['sha256sum_MBps']:7.0f} MB/s")
    print(f"  hashlib sha256 (reference)   {p['hashlib_s']:.3f} s  {p['hashlib_MBps']:7.0f} MB/s")
    print(f"  pull transfer                {p['transfer_s']:.3f} s  {p['transfer_MBps']:7.0f} MB/s"
          f"  {p['ratio_transfer']:.2f}x sha256sum (target >= 0.8x)")
    print(f"  syn pull, whole command      {p['pull_s']:.3f} s  {p['pull_MBps']:7.0f} MB/s"
          f"  {p['ratio_end_to_end']:.2f}x sha256sum")
    print(f"  syn pull, nothing to fetch   {p['fixed_cost_s']:.3f} s  (start, resolve, Varlink)")
    print("import of an existing file:")
    print(f"  full copy, cp + fsync        {i['full_copy_cp_s']:.3f} s")
    print(f"  full copy + hash, Python     {i['full_copy_and_hash_s']:.3f} s")
    print(f"  Register on ext4             {i['ext4_register_s']:.3f} s  "
          "(copy_file_range + hash + fsync; "
          f"{i['full_copy_and_hash_s'] / i['ext4_register_s']:.2f}x"
          " the speed of copy + hash)")
    if "xfs_reflink_register_s" in i:
        print(f"  Register on XFS              {i['xfs_reflink_register_s']:.3f} s  "
              f"(reflink + hash; cp + fsync on XFS {i['xfs_full_copy_cp_s']:.3f} s)")
    else:
        print(f"  Register on XFS              skipped: {i['xfs_skipped']}")
    print(f"  second name, syn pull        {i['second_name_pull_s']:.3f} s  (hard link, no bytes)")
    print(f"  second name, Model1.Pull     {i['second_name_register_s']:.3f} s  "
          f"({i['full_copy_and_hash_s'] / i['second_name_register_s']:.0f}x faster than "
          "copy + hash)")


if __name__ == "__main__":
    main()
