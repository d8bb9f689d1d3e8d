"""llama.cpp's logits next to the numpy oracle's, position by position.

The measure: at each position, the standard deviation of the difference of
the two logit vectors (a shift of all logits changes no probability) divided
by the standard deviation of the oracle's logits there (the scale a sampler
sees): the relative error. The largest absolute
difference, relative the same way, is reported too.

The tolerance is calibrated on the file itself. llama.cpp computes in
float32 with a float16 KV cache and, for quantized weights, rounds each
matrix product's input to 8-bit blocks; the oracle does the same rounding
(emulated) or none (exact, float64). How far the oracle's two answers lie
apart is the noise those roundings alone cause on this model (the floor); a
correct llama.cpp lands within it, a wrong one (a misread tensor, a wrong
rotary pairing or head mapping) lands far outside (relative error near 1).
The check passes when, at every position, the relative error is at most
max(FLOOR_FACTOR x the largest floor, MIN_TOLERANCE), and both pick the same
top token wherever the oracle's top two logits are further apart than
TIE_FACTOR x tolerance x spread (closer, rounding may order them either way:
a near tie, not counted).
"""

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from syntrop.runtimed.oracle.forward import logits as oracle_logits
from syntrop.runtimed.oracle.weights import Array, OracleError, Weights

#: llama.cpp may differ from the emulating oracle by this many times the
#: oracle's own rounding noise...
FLOOR_FACTOR = 2.0
#: ...or by this relative error, whichever is larger.
MIN_TOLERANCE = 0.01
#: Near tie: the oracle's top two logits closer than this many tolerances
#: (times the spread). The relative error is a standard deviation of the
#: per-logit differences; two logits moving a few of those in opposite
#: directions can swap places without anything being wrong.
TIE_FACTOR = 3.0
#: Text whose first tokens are checked when no tokens are given.
TEXT = ("The quick brown fox jumps over the lazy dog. systemd restarted "
        "nginx.service after it failed with exit code 1.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Position:
    """One position's comparison."""

    index: int
    max_abs_diff: float
    scale: float
    #: max_abs_diff / scale
    relative_max: float
    #: standard deviation of the difference / scale
    relative: float
    top_oracle: int
    top_llama: int
    margin: float
    #: None for a near tie (not counted).
    agree: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    path: str
    types: dict[str, int]
    tokens: list[int]
    #: The largest relative error between the oracle's emulated and exact
    #: passes.
    floor: float
    tolerance: float
    positions: list[Position] = field(default_factory=list)

    @property
    def max_relative(self) -> float:
        return max(p.relative for p in self.positions)

    @property
    def max_relative_max(self) -> float:
        return max(p.relative_max for p in self.positions)

    @property
    def top1_checked(self) -> int:
        return sum(p.agree is not None for p in self.positions)

    @property
    def top1_agree(self) -> int:
        return sum(p.agree is True for p in self.positions)

    @property
    def ok(self) -> bool:
        return (self.max_relative <= self.tolerance
                and self.top1_agree == self.top1_checked)


def llama_logits(path: Path, tokens: Sequence[int], *, threads: int) -> Array:
    """llama.cpp's logits after every position (llama-cpp-python,
    logits_all, the whole sequence in one batch)."""
    from llama_cpp import Llama

    from syntrop.runtimed.cpu import ready

    ready()

    llama = Llama(model_path=str(path), n_ctx=max(512, len(tokens)), n_batch=len(tokens),
                  n_ubatch=len(tokens), logits_all=True, n_threads=threads,
                  n_threads_batch=threads, verbose=False)
    try:
        llama.eval(list(tokens))
        result: Array = np.array(llama.scores[: len(tokens)], dtype=np.float64)
    finally:
        llama.close()
    return result


def default_tokens(path: Path, count: int) -> list[int]:
    """The first `count` tokens of TEXT, as llama.cpp tokenizes it."""
    from llama_cpp import Llama

    from syntrop.runtimed.cpu import ready

    ready()

    llama = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        tokens = [int(t) for t in llama.tokenize(TEXT.encode(), add_bos=True)]
    finally:
        llama.close()
    return tokens[:count]


def compare_logits(reference: Array, candidate: Array, *, tie: float) -> list[Position]:
    """Per position: `reference` (the oracle) against `candidate`. A near
    tie: the reference's top two logits closer than `tie` x its spread."""
    positions = []
    for index, (ref, got) in enumerate(zip(reference, candidate, strict=True)):
        diff = float(np.max(np.abs(ref - got)))
        rms = float(np.std(ref - got))  # a shift of every logit changes nothing
        scale = float(np.std(ref)) or 1.0
        top2 = np.argsort(ref)[-2:]
        margin = float(ref[top2[1]] - ref[top2[0]])
        top_oracle, top_llama = int(top2[1]), int(np.argmax(got))
        agree = None if margin <= tie * scale else top_oracle == top_llama
        positions.append(Position(index=index, max_abs_diff=diff, scale=scale,
                                  relative_max=diff / scale, relative=rms / scale,
                                  top_oracle=top_oracle,
                                  top_llama=top_llama, margin=margin, agree=agree))
    return positions


def verify(path: Path, tokens: Sequence[int] | None = None, *, count: int = 16,
           tolerance: float | None = None, threads: int | None = None) -> Report:
    """Run llama.cpp and the oracle (emulated and exact) on `tokens`
    (default: the first `count` of TEXT); `tolerance` overrides the
    calibrated one."""
    weights = Weights(path)
    types = Counter(weights.types().values())
    if tokens is None:
        tokens = default_tokens(path, count)
    tokens = [int(t) for t in tokens]
    if not tokens:
        raise OracleError("no tokens to check")
    reference = oracle_logits(weights, tokens)
    exact = oracle_logits(Weights(path, emulate=False), tokens)
    floor = max(p.relative for p in compare_logits(reference, exact, tie=0.0))
    if tolerance is None:
        tolerance = max(FLOOR_FACTOR * floor, MIN_TOLERANCE)
    candidate = llama_logits(path, tokens, threads=threads or os.cpu_count() or 1)
    return Report(path=str(path), types=dict(types), tokens=tokens, floor=floor,
                  tolerance=tolerance,
                  positions=compare_logits(reference, candidate, tie=TIE_FACTOR * tolerance))


def format_report(report: Report, *, verbose: bool = False) -> str:
    types = ", ".join(f"{n} {t}" for t, n in sorted(report.types.items()))
    lines = [f"{report.path}: {len(report.tokens)} tokens; tensors: {types}"]
    if verbose:
        lines.append("  pos  max|diff|   scale  rel.max  relative  top1 oracle/llama.cpp")
        for p in report.positions:
            mark = {True: "", False: "  MISMATCH", None: "  (near tie)"}[p.agree]
            lines.append(f"  {p.index:3d}  {p.max_abs_diff:9.5f}  {p.scale:6.3f}  "
                         f"{p.relative_max:7.4f}  {p.relative:8.5f}  "
                         f"{p.top_oracle}/{p.top_llama}{mark}")
    lines.append(f"relative error {report.max_relative:.5f}, tolerance "
                 f"{report.tolerance:.5f} (oracle rounding floor {report.floor:.5f}); "
                 f"largest |diff| {report.max_relative_max:.4f} of the logits' spread")
    lines.append(f"top-1 agreement "
                 f"{report.top1_agree}/{report.top1_checked} "
                 f"({len(report.positions) - report.top1_checked} near ties)")
    lines.append("agree" if report.ok else "DISAGREE")
    return "\n".join(lines)
