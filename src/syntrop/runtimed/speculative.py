"""Speculative decoding: a cheap drafter proposes tokens, the target model
checks them all in one batch.

Two drafters:
- `PromptLookup` finds the last few tokens earlier in the context (prompt
  and output so far) and proposes what followed them there: free, and it
  wins where the output copies the input (code edits, quoting);
- `DraftModel` runs a second, smaller GGUF with the same vocabulary
  (checked: `VocabularyMismatch` before any token otherwise) greedily.

`Speculator.generate` is greedy (temperature 0): each step evaluates the
last accepted token plus the draft in one llama_decode with logits for every
position, accepts the longest draft prefix that equals the target's own
argmax, and takes the target's token at the first mismatch, so every step
yields at least one token. Rejected tokens are rolled back by removing their
KV cells (`llama_memory_seq_rm`), never re-evaluated. With an empty draft
the same loop is plain greedy decoding, one token per decode: that is the
reference the output is compared with. Whether the two agree bit for bit
depends on whether llama.cpp computes a token's logits identically in a
batch of k+1 and alone; see `divergence`.
"""

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from syntrop.runtimed import batch as lowlevel


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


def check_vocabulary(target: Any, draft: Any) -> None:
    """Raise `VocabularyMismatch` unless the two models share a tokenizer."""
    t, d = target._model, draft._model
    if t.n_vocab() != d.n_vocab():
        raise VocabularyMismatch(f"{d.n_vocab()} tokens, the target has {t.n_vocab()}")
    if (t.token_bos(), t.token_eos()) != (d.token_bos(), d.token_eos()):
        raise VocabularyMismatch("different beginning/end-of-sequence tokens")
    if vocabulary_digest(target) != vocabulary_digest(draft):
        raise VocabularyMismatch("different token texts")


class DraftModel:
    """A second model drafting greedily; its KV cache follows the context
    (common prefix kept, the rest truncated and re-evaluated)."""

    def __init__(self, target: Any, draft: Any) -> None:
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
        keep = 0
        for a, b in zip(self._resident, context, strict=False):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(context) - 1)  # the last token is always evaluated
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
        self._batch.close()


@dataclass(slots=True)
class Result:
    tokens: list[int]
    #: "stop" (end of generation token) or "length".
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

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class Speculator:
    """Greedy generation on `target` (a `Llama`), drafting with `drafter`
    (None: plain greedy, one token per decode)."""

    def __init__(self, target: Any, drafter: Drafter | None, *, draft_max: int = 8) -> None:
        self._llama = target
        self._ctx = target._ctx.ctx
        self._n_vocab = target._model.n_vocab()
        self._n_ctx = min(int(target.n_ctx()), len(target.input_ids))
        self._batch = lowlevel.Batch(int(target.n_batch))
        self.drafter = drafter
        self.draft_max = max(0, min(draft_max, self._batch.size - 1))

    def generate(self, prompt: Sequence[int], max_tokens: int) -> Result:
        import llama_cpp
        import numpy as np

        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= self._n_ctx:
            raise ValueError(f"{len(prompt)} prompt tokens, context {self._n_ctx}")
        started = time.perf_counter()
        ctx, vocab = self._ctx, self._llama._model.vocab
        lowlevel.truncate(ctx, 0, 0)
        row = lowlevel.prefill(ctx, self._batch, prompt, 0)
        context = list(prompt)
        result = Result(tokens=[], reason="length")
        decoding = time.perf_counter()
        result.prefill_s = decoding - started
        # The target's choice after the context, not yet evaluated.
        pending = int(np.argmax(lowlevel.logits(ctx, row, self._n_vocab)))
        while True:
            if llama_cpp.llama_vocab_is_eog(vocab, pending):
                result.reason = "stop"
                break
            result.tokens.append(pending)
            left = max_tokens - len(result.tokens)
            room = self._n_ctx - len(context) - 1
            if left <= 0 or room <= 0:
                break
            limit = min(self.draft_max, left, room - 1)
            draft = (self.drafter.propose([*context, pending], limit)[:limit]
                     if self.drafter is not None and limit > 0 else [])
            base = len(context)
            rows = self._batch.decode(
                ctx, [(t, base + i, 0, True) for i, t in enumerate([pending, *draft])])
            result.steps += 1
            context.append(pending)
            accepted = 0
            choice = int(np.argmax(lowlevel.logits(ctx, rows[0], self._n_vocab)))
            for i, token in enumerate(draft):
                if choice != token or llama_cpp.llama_vocab_is_eog(vocab, token) \
                        or len(result.tokens) >= max_tokens:
                    break
                accepted += 1
                result.tokens.append(token)
                context.append(token)
                choice = int(np.argmax(lowlevel.logits(ctx, rows[i + 1], self._n_vocab)))
            result.drafted += len(draft)
            result.accepted += accepted
            result.yields.append(1 + accepted)
            if accepted < len(draft):
                lowlevel.truncate(ctx, 0, len(context))  # roll back the rejected
            if len(result.tokens) >= max_tokens:
                break
            pending = choice
        lowlevel.sync(self._llama, context)
        result.seconds = time.perf_counter() - decoding
        return result

    def close(self) -> None:
        self._batch.close()


def divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where two outputs differ (None: equal)."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))
