"""Token log-probabilities for a stream (Sampling.logprobs, OpenAI's
logprobs and top_logprobs), from one logits row at a time.

The log-probability is the log-softmax of the raw logits the token was
sampled from: the model's own distribution, before the sampler chain's
temperature and truncations and before a constraint's mask or a reasoning
budget's forcing (the decoding paths hand over the row as llama.cpp wrote
it). Computed only for streams that ask: a pass over the vocabulary for the
normaliser, and block maxima to find the alternatives (`candidates`).

Pure: numpy only (imported inside), the text of a token from a callable.
"""

import math
from collections.abc import Callable
from typing import Any

#: What a log-probability of -inf (a logit of -inf) reads as: JSON has no
#: infinity.
FLOOR = -9999.0

#: One entry of Chunk.logprobs as the worker sends it (TokenLogprob's fields).
Entry = dict[str, Any]


def _finite(value: float) -> float:
    return min(0.0, value) if value >= FLOOR else FLOOR


def score(logits: Any, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `token` under softmax(`logits`), and the `top`
    most likely tokens with theirs, most likely first (ties: lower id first).
    Values below FLOOR (or NaN) read as FLOOR."""
    import numpy as np

    row = np.asarray(logits, dtype=np.float32)
    peak = float(row.max())
    if not math.isfinite(peak):
        return FLOOR, [(int(i), FLOOR) for i in range(min(top, row.size))]
    # log(sum(exp(x - peak))) >= 0: the peak adds exp(0) = 1, so each value
    # is at most 0 before _finite too.
    shifted = row - peak
    np.exp(shifted, out=shifted)
    normaliser = peak + math.log(float(shifted.sum(dtype=np.float64)))
    chosen = _finite(float(row[token]) - normaliser)
    if top <= 0:
        return chosen, []
    ids = candidates(row, top)
    order = ids[np.lexsort((ids, -row[ids]))][:top]
    return chosen, [(int(i), _finite(float(row[i]) - normaliser)) for i in order]


#: Tokens per block in `candidates`.
BLOCK = 64


def candidates(row: Any, top: int) -> Any:
    """Ids of `row` that include its `top` largest values and every value
    equal to the smallest of them (so ties can go to the lowest id, as
    greedy sampling does): those at least the top-th largest block maximum.
    Each of the `top` blocks with the largest maxima holds a value that
    high, so the top-th largest value is at least as high. A few passes over
    the row, several times cheaper than an argpartition of a vocabulary."""
    import numpy as np

    full = row.size // BLOCK * BLOCK
    blocks = row.size // BLOCK + (full < row.size)
    if blocks <= top:
        return np.arange(row.size)
    maxima = row[:full].reshape(-1, BLOCK).max(axis=1)
    if full < row.size:
        maxima = np.append(maxima, row[full:].max())
    threshold = np.partition(maxima, blocks - top)[blocks - top]
    return np.flatnonzero(row >= threshold)


class Scorer:
    """A stream's logprob entries: `score` for the numbers, `piece` for each
    token's bytes (the same rendering the stream's text uses), cached per
    token id for the stream's length."""

    def __init__(self, piece: Callable[[int], bytes], top: int) -> None:
        self._piece = piece
        self.top = top
        self._pieces: dict[int, tuple[str, list[int]]] = {}

    def _text(self, token: int) -> tuple[str, list[int]]:
        known = self._pieces.get(token)
        if known is None:
            data = self._piece(token)
            known = self._pieces[token] = (data.decode("utf-8", errors="replace"), list(data))
        return known

    def entry(self, logits: Any, token: int, piece: bytes | None = None) -> Entry:
        """The entry of `token`, sampled from `logits`; `piece` is what it
        added to the text (b"" for a thinking marker), its own bytes if None."""
        logprob, alternatives = score(logits, token, self.top)
        if piece is None:
            text, data = self._text(token)
        else:
            text, data = piece.decode("utf-8", errors="replace"), list(piece)
        top = []
        for alternative, value in alternatives:
            alt_text, alt_data = self._text(alternative)
            top.append({"token": alt_text, "logprob": value, "bytes": alt_data})
        return {"token": text, "logprob": logprob, "bytes": data, "top": top}
