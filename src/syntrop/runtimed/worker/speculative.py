"""Speculative decoding: a cheap drafter proposes tokens, the target model
checks them all in one batch.

Two drafters:
- `PromptLookup` finds the last few tokens earlier in the context (prompt
  and output so far) and proposes what followed them there: free, and it
  wins where the output copies the input (code edits, quoting);
- `DraftModel` runs a second, smaller GGUF with the same vocabulary
  (checked: `VocabularyMismatch` before any token otherwise) greedily.

`Speculator.generate` evaluates the last emitted token plus the draft in one
llama_decode with logits for every position, takes the target's own token at
each position in turn, keeps the draft while it agrees and stops at the first
disagreement, so every step yields at least one token. Rejected tokens are
rolled back by removing their KV cells (`llama_memory_seq_rm`), never
re-evaluated. A prompt that extends what the target holds (its
`input_ids[:n_tokens]`, left by the last generation or by llama-cpp-python)
reuses that prefix; only the rest is evaluated.

Greedy (`Sampler.temperature` <= 0, or no sampler): the target's token is
the argmax of its logits (the first on a tie, as llama.cpp's greedy sampler).
With an empty draft the same loop is plain greedy decoding, one token per
decode: that is the reference the output is compared with. Whether the two
agree bit for bit depends on whether llama.cpp computes a token's logits
identically in a batch of k+1 and alone; see `divergence`.

Sampling (temperature > 0): `distribution` reproduces, in float64 numpy, the
chain llama-cpp-python builds for a temperature above 0 (`_init_sampler`;
the repetition penalties at their neutral 1.0/0/0 and typical-p at 1.0 are
no-ops):
- top_k: keep the k highest logits (k <= 0 or k >= vocabulary: all); ties at
  the cut go to the lower token id, where llama.cpp's order is unspecified;
- top_p (< 1): softmax of the remaining logits before temperature, sorted
  descending; keep the smallest prefix whose cumulative probability reaches
  top_p (at least one token);
- min_p (> 0): keep the logits >= max + ln(min_p), i.e. probability at
  least min_p times the top one's, before temperature (at least one token);
- temperature: the kept logits divided by it, then softmax.
llama.cpp works in float32: a token within rounding of a top_p or min_p cut
may fall on the other side; elsewhere the probabilities agree with the C
chain's to float32 precision (tested against it). Past 1024 candidates (top_k 0)
top_p looks at the 256 most likely first, as llama.cpp does; a flat row
with top_k 0 is sorted whole (milliseconds per token on a 49k vocabulary).
Both drafters are deterministic (the draft model drafts greedily), so the
draft distribution is one-hot and speculative sampling reduces to: accept
draft token x with probability p(x); on rejection the token is drawn from p
without x, renormalised; after a fully accepted draft the bonus token is
drawn from p. `verify` realises exactly that rule by coupling: it draws the
target's token from p by inverse CDF with one uniform from the generator and
accepts the draft iff they are equal (probability p(x); given rejection the
token is distributed as p without x, renormalised). Every emitted position
consumes one uniform from `numpy.random.default_rng(seed)`, whatever was
drafted, so the text is a function of the seed and the target's logits: the
same seed gives the same text with either drafter or none (where the batch
arithmetic is bit-identical, as for greedy), and the output distribution is
exactly the target's. It is not the text llama.cpp's own sampler (mt19937,
one draw per token over its sorted candidates) gives for that seed.
"""

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from syntrop.runtimed.worker import batch as lowlevel


@dataclass(frozen=True, slots=True)
class Sampler:
    """How the target picks tokens (module docstring); temperature <= 0 is
    greedy, the other fields then do nothing."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


#: Above this many candidates, top_p tries the HEAD most likely before a full sort.
LARGE, HEAD = 1024, 256


def _largest(x: Any, k: int) -> Any:
    """Ids of the `k` largest values of `x` (ties by ascending id), ascending
    within equal values."""
    import numpy as np

    kth = np.partition(x, x.size - k)[x.size - k]
    above = np.flatnonzero(x > kth)
    return np.concatenate([above, np.flatnonzero(x == kth)[:k - above.size]])


def candidates(logits: Any, sampler: Sampler) -> Any:
    """Token ids (ascending) that survive top_k, then top_p, then min_p.

    top_p and min_p each keep a prefix of the candidates sorted by
    descending logit, relative to the same top logit, so the result is the
    shorter prefix: the min_p survivors are sorted (not the whole row) with
    top_p's normaliser over everything top_k left. Logits are compared in
    float64; ties in a sort go to the lower id."""
    import numpy as np

    x = np.asarray(logits)
    size, k = x.size, sampler.top_k
    pool = _largest(x, k) if 0 < k < size else np.arange(size)
    values = x[pool].astype(np.float64)
    top = values.max()
    keep = None
    if sampler.min_p > 0.0:
        keep = values >= top + np.log(sampler.min_p)
        if not keep.any():  # min_p above 1: the top token alone
            keep[int(np.argmax(values))] = True
    if sampler.top_p < 1.0:
        weights = np.exp(values - top)
        total = weights.sum()
        if keep is not None:
            pool, values, weights = pool[keep], values[keep], weights[keep]
        if pool.size > LARGE:
            # As llama.cpp: the head alone when it holds top_p already.
            head = _largest(values, HEAD)
            if weights[head].sum() >= sampler.top_p * total:
                pool, values, weights = pool[head], values[head], weights[head]
        order = np.argsort(-values, kind="stable")
        cumulative = np.cumsum(weights[order] / total)
        pool = pool[order[:int(np.searchsorted(cumulative, sampler.top_p)) + 1]]
    elif keep is not None:
        pool = pool[keep]
    return np.sort(pool)


def _weights(logits: Any, sampler: Sampler) -> tuple[Any, Any]:
    """The surviving ids (ascending) and their probabilities."""
    import numpy as np

    ids = candidates(logits, sampler)
    values = np.asarray(logits)[ids].astype(np.float64)
    weights = np.exp((values - values.max()) / sampler.temperature)
    return ids, weights / weights.sum()


def distribution(logits: Any, sampler: Sampler) -> Any:
    """The target's probabilities over the vocabulary (float64) for one
    logits row: one-hot on the argmax when greedy, else llama.cpp's
    top_k → top_p → min_p → temperature → softmax."""
    import numpy as np

    probabilities = np.zeros(np.asarray(logits).size)
    if sampler.greedy:
        probabilities[int(np.argmax(logits))] = 1.0
    else:
        ids, weights = _weights(logits, sampler)
        probabilities[ids] = weights
    return probabilities


def _inverse_cdf(ids: Any, probabilities: Any, u: float) -> int:
    """The token at `u` (in [0, 1)) of the cumulative distribution, ids ascending."""
    import numpy as np

    cumulative = np.cumsum(probabilities)
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    return int(ids[min(index, ids.size - 1)])


def draw(probabilities: Any, rng: Any) -> int:
    """A token drawn from `probabilities` by inverse CDF (ids ascending)
    with one uniform from `rng` (a numpy Generator)."""
    import numpy as np

    support = np.flatnonzero(probabilities)
    return _inverse_cdf(support, probabilities[support], rng.random())


def sample(logits: Any, sampler: Sampler, rng: Any) -> int:
    """`draw(distribution(logits, sampler), rng)` without the vocabulary-sized
    vector (the argmax, drawing nothing, when greedy)."""
    import numpy as np

    if sampler.greedy:
        return int(np.argmax(logits))
    ids, probabilities = _weights(logits, sampler)
    positive = probabilities > 0.0
    return _inverse_cdf(ids[positive], probabilities[positive], rng.random())


def verify(probabilities: Any, draft: int, rng: Any) -> tuple[bool, int]:
    """One verification position of speculative sampling with a one-hot
    draft: whether `draft` is accepted (probability p(draft)), and the token
    emitted there: `draft` if so, else a token distributed as p without
    `draft`, renormalised. The target's token is drawn (`draw`) and compared
    with the draft, so the output does not depend on what was drafted."""
    token = draw(probabilities, rng)
    return token == draft, token


def common_prefix(a: Any, b: Any) -> int:
    """How many leading tokens `a` and `b` (sequences or numpy arrays of
    token ids) share."""
    import numpy as np

    size = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:size], dtype=np.int64)
                            != np.asarray(b[:size], dtype=np.int64))
    return int(differ[0]) if differ.size else size


class SpeculativeError(Exception):
    """Base of speculative-decoding errors."""


class VocabularyMismatch(SpeculativeError):
    """The draft model tokenizes differently from the target."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"draft model vocabulary does not match the target: {reason}")
        self.reason = reason


class Drafter(Protocol):
    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens likely to follow `context`."""


def lookup(context: Sequence[int], limit: int, *, ngram_max: int = 3,
           ngram_min: int = 1) -> list[int]:
    """Prompt-lookup drafting: the tokens that followed the most recent
    earlier occurrence of the context's last n tokens (longest n first,
    from `ngram_max` down to `ngram_min`), at most `limit` of them."""
    size = len(context)
    if limit <= 0:
        return []
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        tail = list(context[size - n:])
        # Most recent match first; the match must end before the tail does.
        for start in range(size - n - 1, -1, -1):
            if list(context[start:start + n]) == tail:
                follow = list(context[start + n:start + n + limit])
                if follow:
                    return follow
    return []


@dataclass(slots=True)
class PromptLookup:
    """The `lookup` drafter."""

    ngram_max: int = 3
    ngram_min: int = 1

    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        return lookup(context, limit, ngram_max=self.ngram_max, ngram_min=self.ngram_min)


def vocabulary_digest(llama: Any) -> str:
    """SHA-256 over the vocabulary type, size and every token's text."""
    import llama_cpp

    model = llama._model
    digest = hashlib.sha256()
    digest.update(f"{llama_cpp.llama_vocab_type(model.vocab)}:{model.n_vocab()}".encode())
    for token in range(model.n_vocab()):
        digest.update(model.token_get_text(token).encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def check_vocabulary(target: Any, draft: Any, *,
                     digests: tuple[str | None, str | None] = (None, None)) -> None:
    """Raise `VocabularyMismatch` unless the two models share a tokenizer.
    `digests`: the two models' `vocabulary_digest` where already known
    (computing one reads every token's text)."""
    t, d = target._model, draft._model
    if t.n_vocab() != d.n_vocab():
        raise VocabularyMismatch(f"{d.n_vocab()} tokens, the target has {t.n_vocab()}")
    if (t.token_bos(), t.token_eos()) != (d.token_bos(), d.token_eos()):
        raise VocabularyMismatch("different beginning/end-of-sequence tokens")
    known_target, known_draft = digests
    if (known_target or vocabulary_digest(target)) != (known_draft or vocabulary_digest(draft)):
        raise VocabularyMismatch("different token texts")


class DraftModel:
    """A second model drafting greedily; its KV cache follows the context
    (common prefix kept, the rest truncated and re-evaluated). `checked`:
    the caller has run `check_vocabulary` already."""

    def __init__(self, target: Any, draft: Any, *, checked: bool = False) -> None:
        if not checked:
            check_vocabulary(target, draft)
        self._llama = draft
        self._ctx = draft._ctx.ctx
        self._n_vocab = draft._model.n_vocab()
        self._n_ctx = int(draft.n_ctx())
        self._batch = lowlevel.Batch(int(draft.n_batch))
        self._resident: list[int] = []
        lowlevel.truncate(self._ctx, 0, 0)

    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        import numpy as np

        limit = min(limit, self._n_ctx - len(context) - 1)
        if limit <= 0 or not context:
            return []
        # The last token is always evaluated: its logits give the first draft.
        keep = min(common_prefix(self._resident, context), len(context) - 1)
        lowlevel.truncate(self._ctx, 0, keep)
        row = lowlevel.prefill(self._ctx, self._batch, context[keep:], keep)
        resident = list(context)
        out: list[int] = []
        while True:
            token = int(np.argmax(lowlevel.logits(self._ctx, row, self._n_vocab)))
            out.append(token)
            if len(out) >= limit:
                break
            row = self._batch.decode(self._ctx, [(token, len(resident), 0, True)])[0]
            resident.append(token)
        self._resident = resident
        return out

    def close(self) -> None:
        """Free the batch and leave the draft's context empty, its `Llama`
        told so: whoever uses that context next (its model's own requests)
        must not reuse cells drafting rewrote behind its back."""
        self._batch.close()
        lowlevel.truncate(self._ctx, 0, 0)
        lowlevel.sync(self._llama, [])
        self._resident = []


@dataclass(slots=True)
class Result:
    tokens: list[int]
    #: "stop" (end of generation token, or on_tokens said so), "length" or
    #: "cancelled" (the stop event).
    reason: str
    #: Draft tokens proposed and accepted, and target decode calls.
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    #: Prompt evaluation, and decoding after it (drafting included).
    prefill_s: float = 0.0
    seconds: float = 0.0
    #: Per decode step: how many tokens it yielded.
    yields: list[int] = field(default_factory=list)
    #: Prompt tokens found resident in the KV cache, not evaluated again.
    reused: int = 0
    #: The last token handed out that is not in the KV cache yet (the next
    #: step would have evaluated it); None when every emitted token is.
    pending: int | None = None

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class Speculator:
    """Generation on `target` (a `Llama`), drafting with `drafter` (None:
    plain decoding, one token per decode)."""

    def __init__(self, target: Any, drafter: Drafter | None, *, draft_max: int = 8) -> None:
        self._llama = target
        self._ctx = target._ctx.ctx
        self._n_vocab = target._model.n_vocab()
        self._n_ctx = min(int(target.n_ctx()), len(target.input_ids))
        self._batch = lowlevel.Batch(int(target.n_batch))
        self.drafter = drafter
        self.draft_max = max(0, min(draft_max, self._batch.size - 1))

    def generate(self, prompt: Sequence[int], max_tokens: int, *,
                 sampler: Sampler | None = None,
                 on_tokens: Callable[[list[int]], bool] | None = None,
                 stop: threading.Event | None = None) -> Result:
        """Up to `max_tokens` tokens after `prompt`, picked as `sampler`
        says (None: greedy). `on_tokens` gets the tokens as they are decided,
        in order, never an end-of-generation token: first the one chosen
        from the prompt's logits, then each verification step's (accepted
        drafts and the target's own token); returning False stops (reason
        "stop", those tokens included in the result). `stop` is checked
        before the prompt and before every step ("cancelled")."""
        import llama_cpp

        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= self._n_ctx:
            raise ValueError(f"{len(prompt)} prompt tokens, context {self._n_ctx}")
        result = Result(tokens=[], reason="length")
        if stop is not None and stop.is_set():
            result.reason = "cancelled"
            return result
        started = time.perf_counter()
        ctx, vocab = self._ctx, self._llama._model.vocab
        pick = self._picker(sampler or Sampler())

        def ends(token: int) -> bool:
            return bool(llama_cpp.llama_vocab_is_eog(vocab, token))

        llama = self._llama
        # The last prompt token is always evaluated: its logits give the first token.
        keep = min(common_prefix(llama.input_ids[:llama.n_tokens], prompt), len(prompt) - 1)
        context = list(prompt[:keep])  # the tokens resident in the KV cache
        try:
            lowlevel.truncate(ctx, 0, keep)
            row = lowlevel.prefill(ctx, self._batch, prompt[keep:], keep)
            context = list(prompt)
            result.reused = keep
            decoding = time.perf_counter()
            result.prefill_s = decoding - started
            # `pending`: the last token emitted, not yet evaluated.
            first = pick(row)
            ended = ends(first)
            emitted = [] if ended else [first]
            pending: int | None = None if ended else first
            while True:
                result.tokens += emitted
                if emitted and on_tokens is not None and not on_tokens(emitted):
                    result.reason = "stop"
                    break
                if ended:
                    result.reason = "stop"
                    break
                left = max_tokens - len(result.tokens)
                room = self._n_ctx - len(context) - 1
                if pending is None or left <= 0 or room <= 0:
                    break
                if stop is not None and stop.is_set():
                    result.reason = "cancelled"
                    break
                draft = self._draft([*context, pending], min(self.draft_max, left, room - 1),
                                    ends)
                base = len(context)
                rows = self._batch.decode(
                    ctx, [(t, base + i, 0, True) for i, t in enumerate([pending, *draft])])
                context.append(pending)
                emitted, pending, accepted = [], None, 0
                for i, row in enumerate(rows):
                    if len(result.tokens) + len(emitted) >= max_tokens:
                        break
                    token = pick(row)
                    if ends(token):
                        ended = True
                        break
                    emitted.append(token)
                    if i < len(draft) and token == draft[i]:
                        accepted += 1
                        context.append(token)
                        continue
                    pending = token
                    break
                result.steps += 1
                result.drafted += len(draft)
                result.accepted += accepted
                result.yields.append(len(emitted))
                if accepted < len(draft):
                    lowlevel.truncate(ctx, 0, len(context))  # roll back the rejected
            result.pending = pending
            result.seconds = time.perf_counter() - decoding
        finally:
            # Whatever happened, the cache holds exactly `context`, and the
            # Llama knows it (its own generate reuses the prefix).
            lowlevel.truncate(ctx, 0, len(context))
            lowlevel.sync(llama, context)
        return result

    def _picker(self, sampler: Sampler) -> Callable[[int], int]:
        """The target's choice from the logits row of a batch index."""
        import numpy as np

        ctx, n_vocab = self._ctx, self._n_vocab
        if sampler.greedy:
            return lambda row: int(np.argmax(lowlevel.logits(ctx, row, n_vocab)))
        rng = np.random.default_rng(sampler.seed)
        return lambda row: sample(lowlevel.logits(ctx, row, n_vocab), sampler, rng)

    def _draft(self, context: list[int], limit: int, ends: Callable[[int], bool]) -> list[int]:
        """At most `limit` drafted tokens, cut before an end of generation
        (the target's own token decides that)."""
        if self.drafter is None or limit <= 0:
            return []
        draft = self.drafter.propose(context, limit)[:limit]
        for i, token in enumerate(draft):
            if ends(token):
                return draft[:i]
        return draft

    def close(self) -> None:
        self._batch.close()


def divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where two outputs differ (None: equal)."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))
