"""GPU offload as runtimed would place it, against the CPU-only baseline,
same run, same model, same host.

On a host with an NVIDIA GPU and a CUDA build of the engine (make
SYNTROP_ACCEL=cuda): reads this host's topology (inferenced's scan of
sysfs, GPU memory from NVML or nvidia-smi), makes the grant inferenced
could give (the free memory of `--gpus` GPUs chosen by its affinity rule,
capped at `--vram` each), turns it into llama.cpp settings with
placement.place(), and measures decode tokens/s of `--tokens` greedy tokens
with them and with a CPU lease's placement (n_gpu_layers 0, no GPU
visible). Each measurement runs in a process of its own whose environment
and CPU affinity are the placement's (CUDA_VISIBLE_DEVICES: the granted
GPUs only; the kwargs are the masked ones). It prints where the layers
went (n_gpu_layers, split mode, main GPU, tensor split, layers per plane)
next to each figure.

--dry-run computes and prints the placements and the llama kwargs without
loading anything; on a host without a GPU it says so and shows the CPU
placement.

Run: .venv/bin/python bench/gpu_offload.py --model FILE.gguf [--dry-run] [--json]
     [--tokens N] [--gpus N] [--mode pipeline|tensor] [--vram BYTES] [--n-ctx N]
"""

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from syntrop import modelfile  # noqa: E402
from syntrop.inferenced.topology import DeviceConfig, TopologyConfig, choose, scan  # noqa: E402
from syntrop.runtimed import placement as pl  # noqa: E402

NODES = Path("/sys/devices/system/node")
PROMPT = b"1, 2, 3, 4, 5, 6, 7, 8,"


def node_cpus(root: Path = NODES) -> dict[int, tuple[int, ...]]:
    """NUMA node -> its CPUs (each node's cpulist)."""
    found = {}
    for path in sorted(root.glob("node*/cpulist")):
        if path.parent.name[4:].isdigit():
            found[int(path.parent.name[4:])] = pl.parse_cpulist(path.read_text())
    return found


def smi_memory() -> dict[str, tuple[int, int]]:
    """PCI address -> (total, used) bytes of NVIDIA GPUs, from nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        done = subprocess.run([smi, "--query-gpu=pci.bus_id,memory.total,memory.used",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found[parts[0].lower()[-12:]] = (int(parts[1]) << 20, int(parts[2]) << 20)
    return found


def host() -> tuple[Any, list[pl.PlaneView], dict[str, int]]:
    """This host's topology, its plane views, and each GPU's free bytes."""
    topology = scan(Path("/"))
    smi = smi_memory()
    missing = {p.id: smi[p.pci_chain[-1]] for p in topology.planes
               if p.kind == "drm_gpu" and p.total_memory == 0 and p.pci_chain
               and p.pci_chain[-1] in smi}
    if missing:
        topology = scan(Path("/"), TopologyConfig(devices={
            plane_id: DeviceConfig(memory_bytes=total) for plane_id, (total, _) in
            missing.items()}))
    used = {plane_id: u for plane_id, (_, u) in missing.items()}
    free = {p.id: max(0, p.total_memory - used.get(p.id, p.used_memory))
            for p in topology.planes if p.kind == "drm_gpu" and p.total_memory > 0}
    return topology, pl.planes_from_topology(topology, node_cpus()), free


def header(path: Path) -> dict[str, Any]:
    """The GGUF header's metadata, read by syntrop's own header reader."""
    with path.open("rb") as stream:
        return dict(modelfile.read(stream).metadata)


def grant(topology: Any, free: dict[str, int], count: int, mode: str,
          vram: int | None) -> pl.Grant | None:
    """What inferenced could grant: `count` GPUs by its affinity rule."""
    gpus = [p for p in topology.planes if p.id in free]
    chosen = choose(gpus, count, topology.numa_distances, pipeline=mode == "pipeline")
    if not chosen:
        return None
    sizes = [min(free[p.id], vram) if vram else free[p.id] for p in chosen]
    if count == 1:
        return pl.Grant.single(chosen[0].id, sizes[0])
    return pl.Grant.from_slices(
        pl.Slice(plane_id=p.id, memory_bytes=size, role=mode,
                 stage_index=i if mode == "pipeline" else None)
        for i, (p, size) in enumerate(zip(chosen, sizes, strict=True)))


def describe(placed: pl.Placement) -> str:
    split = "none" if placed.tensor_split is None else \
        "[" + ", ".join(f"{s:.2f}" for s in placed.tensor_split) + "]"
    return (f"n_gpu_layers={placed.n_gpu_layers} split_mode={placed.split_mode} "
            f"main_gpu={placed.main_gpu} tensor_split={split} threads={placed.n_threads} "
            f"layers={dict(placed.layers)} output_head={placed.output_on}")


# --- the measuring child --------------------------------------------------

def load_gpu_backends() -> list[str]:
    """Load the wheel's GPU backend modules (libggml-cuda.so) into the
    libggml that libllama uses: with GGML_BACKEND_DL nothing loads them once
    the CPU variant is loaded (llama.cpp loads all only into an empty
    registry)."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    modules = sorted(lib.glob("libggml-cuda*.so"))
    if not modules:
        return []
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps
                        if re.search(r"/libggml\.so(\.\d+)*$", line.strip())})
    ggml = ctypes.CDLL(paths[0] if paths else str(lib / "libggml.so"))
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    return [m.name for m in modules if ggml.ggml_backend_load(str(m).encode())]


def measure(path: str, kwargs: dict[str, Any], tokens: int, n_ctx: int) -> dict[str, Any]:
    from syntrop.runtimed.cpu import ready

    choice = ready()
    loaded = load_gpu_backends()
    import llama_cpp
    from llama_cpp import Llama

    started = time.perf_counter()
    llama = Llama(model_path=path, n_ctx=n_ctx, verbose=False, **kwargs)
    load = time.perf_counter() - started
    llama.eval(llama.tokenize(PROMPT, add_bos=True))
    produced = 0
    started = time.perf_counter()
    for token in llama.generate([], temp=0.0, top_k=1, reset=False):
        produced += 1
        if produced >= tokens or llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            break
    rate = produced / (time.perf_counter() - started)
    llama.close()
    return {"tok_s": rate, "tokens": produced, "load_s": load, "engine": choice.describe(),
            "backends": loaded}


def run_child(model: Path, placed: pl.Placement, tokens: int, n_ctx: int) -> dict[str, Any]:
    env = dict(os.environ, **placed.environment())
    env["PYTHONPATH"] = str(REPO / "src")
    affinity = placed.cpu_affinity

    def pin() -> None:
        if affinity:
            os.sched_setaffinity(0, affinity)

    done = subprocess.run([sys.executable, __file__, "--measure", json.dumps({
        "path": str(model), "kwargs": placed.llama_kwargs(masked=True), "tokens": tokens,
        "n_ctx": n_ctx})], env=env, capture_output=True, text=True, check=False,
        preexec_fn=pin)
    if done.returncode != 0:
        raise SystemExit(f"gpu_offload: measuring {describe(placed)} failed: "
                         f"{done.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF file")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the placements and kwargs; load nothing")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs in the grant")
    parser.add_argument("--mode", choices=("pipeline", "tensor"), default="pipeline")
    parser.add_argument("--vram", type=int, help="bytes granted per GPU, at most (hybrid)")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        job = json.loads(args.measure)
        print(json.dumps(measure(job["path"], job["kwargs"], job["tokens"], job["n_ctx"])))
        return
    if args.model is None or not args.model.is_file():
        parser.error("--model FILE.gguf is required")

    shape = pl.shape_from_gguf(header(args.model), args.model.stat().st_size, n_ctx=args.n_ctx)
    topology, planes, free = host()
    cpu_plane = next(p.id for p in planes if p.kind == "cpu")
    baseline = pl.place(shape, pl.Grant.single(cpu_plane, pl.estimated_bytes(shape)), planes)
    gpu_grant = grant(topology, free, args.gpus, args.mode, args.vram) if free else None
    placed = pl.place(shape, gpu_grant, planes) if gpu_grant else None

    report: dict[str, Any] = {
        "model": args.model.name, "shape": asdict(shape),
        "gpus": {p.id: free[p.id] for p in topology.planes if p.id in free},
        "cpu": {"why": baseline.why, "kwargs": baseline.llama_kwargs(masked=True),
                "environment": baseline.environment()},
    }
    if placed is not None:
        report["gpu"] = {"why": placed.why, "kwargs": placed.llama_kwargs(masked=True),
                         "unmasked_kwargs": placed.llama_kwargs(),
                         "environment": placed.environment()}
    if not args.json:
        print(f"model: {args.model.name}, {shape.n_layers} layers, "
              f"{pl.estimated_bytes(shape) / 2**30:.2f} GiB on a CPU lease "
              f"({pl.estimated_bytes(shape, kind='drm_gpu') / 2**30:.2f} GiB on a GPU), "
              f"context {args.n_ctx}")
        if placed is None:
            print("no GPU found" + (f" ({len(free)} GPUs, fewer than --gpus {args.gpus})"
                                    if free else " (no GPU plane with known memory)")
                  + ": the CPU placement only")
        for name, item in (("gpu", placed), ("cpu", baseline)):
            if item is None:
                continue
            print(f"{name} placement: {item.why}")
            print(f"  {describe(item)}")
            print(f"  llama kwargs: {item.llama_kwargs(masked=True)}")
            print(f"  environment: {item.environment()}")
    if args.dry_run:
        if args.json:
            print(json.dumps(report))
        return
    if placed is None:
        raise SystemExit("gpu_offload: no GPU found: nothing to measure (see --dry-run)")

    results = {"cpu": run_child(args.model, baseline, args.tokens, args.n_ctx),
               "gpu": run_child(args.model, placed, args.tokens, args.n_ctx)}
    report["results"] = results
    if args.json:
        print(json.dumps(report))
        return
    cpu, gpu = results["cpu"], results["gpu"]
    print(f"decode, {args.tokens} greedy tokens (load s in brackets):")
    print(f"  gpu offload  {gpu['tok_s']:8.1f} tok/s ({gpu['load_s']:.1f} s)  "
          f"{describe(placed)}  backends {gpu['backends']}")
    print(f"  cpu baseline {cpu['tok_s']:8.1f} tok/s ({cpu['load_s']:.1f} s)  "
          f"{describe(baseline)}")
    print(f"  ratio {gpu['tok_s'] / cpu['tok_s']:.2f}x over the CPU-only baseline")


if __name__ == "__main__":
    main()
