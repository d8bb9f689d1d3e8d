"""Streaming past the context window with attention sinks.

A stream keeps the first `sinks` tokens of its sequence (the attention
sinks: models put much attention on the first positions, and dropping them
wrecks generation) and slides a window over the rest. When the next token
would not fit the context, `discard` tokens right after the sinks leave the
KV cache and the ones after them move down by `discard` positions
(llama.cpp's KV shift: `llama_memory_seq_rm` plus `llama_memory_seq_add`,
which re-rotates the cached keys), so memory stays at one context while the
stream runs on without bound. What was said is kept in a `Journal`
(journal.py): the last `limit` bytes of the stream's text.

`plan` is pure; `Window` is a session's sliding window (the
service's sessions with `sinks`, through `Engine.shift`); `Stream` drives a
`Llama`'s context on its own (tests, benchmarks).
"""

import codecs
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from syntrop.runtimed.journal import Journal
from syntrop.runtimed.worker import batch as lowlevel


class SinkError(Exception):
    """Base of attention-sink streaming errors."""


class ShiftUnsupported(SinkError):
    """The model's memory cannot shift positions (e.g. recurrent models)."""


@dataclass(frozen=True, slots=True)
class Shift:
    """Drop positions [start, start + count), move the rest down by count."""

    start: int
    count: int
    end: int  # one past the last position in use before the shift


def default_discard(n_ctx: int, sinks: int) -> int:
    """Half of the window after the sinks, at least one token."""
    return max(1, (n_ctx - sinks) // 2)


def plan(n_past: int, incoming: int, n_ctx: int, sinks: int, discard: int) -> Shift | None:
    """The shift needed before `incoming` more tokens are evaluated after
    `n_past` resident ones, or None when they fit."""
    if sinks < 0 or discard < 1:
        raise ValueError(f"bad window: {sinks} sinks, discard {discard}")
    if n_past + incoming <= n_ctx:
        return None
    if min(n_past, sinks) + incoming > n_ctx:
        raise ValueError(f"{sinks} sinks and {incoming} tokens do not fit a context "
                         f"of {n_ctx}")
    # Enough whole discards to make room (one, unless incoming is large).
    needed = n_past + incoming - n_ctx
    count = min(n_past - sinks, -(-needed // discard) * discard)
    return Shift(start=sinks, count=count, end=n_past)


def apply(window: list[int], shift: Shift) -> list[int]:
    """The resident tokens after `shift`."""
    return window[:shift.start] + window[shift.start + shift.count:]


def shift_cache(ctx: Any, shift: Shift, seq: int = 0) -> None:
    """Carry out `shift` on sequence `seq` of a context's KV cache."""
    import llama_cpp

    mem = lowlevel.memory(ctx)
    llama_cpp.llama_memory_seq_rm(mem, seq, shift.start, shift.start + shift.count)
    llama_cpp.llama_memory_seq_add(mem, seq, shift.start + shift.count, shift.end, -shift.count)


@dataclass(slots=True)
class Window:
    """A session's sliding window: `sinks` first tokens kept, `discard`
    tokens after them dropped per shift (None: half the rest), the text
    kept in `journal`, and what shifting has dropped so far."""

    sinks: int
    journal: Journal
    discard: int | None = None
    shifts: int = 0
    shifted: int = 0
    #: A shift dropped part of the session's prefix (only its first `sinks`
    #: tokens are left) since the last EnsurePrefix.
    prefix_cut: bool = False
    #: Tokens dropped since the last `take_shifted`.
    _recent: int = field(default=0, repr=False)

    def slide(self, ctx: Any, resident: Sequence[int], incoming: int, n_ctx: int) -> int:
        """Shift sequence 0 of `ctx` (holding `resident`) so `incoming` more
        tokens fit in `n_ctx`; tokens dropped (0: they fit already)."""
        shift = plan(len(resident), incoming, n_ctx, self.sinks,
                     self.discard or default_discard(n_ctx, self.sinks))
        if shift is None:
            return 0
        shift_cache(ctx, shift)
        self.shifts += 1
        self.shifted += shift.count
        self._recent += shift.count
        return shift.count

    def take_shifted(self) -> int:
        """Tokens dropped since the last call."""
        recent, self._recent = self._recent, 0
        return recent


class Stream:
    """Generate on sequence 0 of `llama`'s context without a length limit.

    temperature 0 is greedy; otherwise llama.cpp's sampler chain (top-k,
    temperature, seeded draw)."""

    def __init__(self, llama: Any, *, sinks: int = 4, discard: int | None = None,
                 journal_bytes: int = 16384, temperature: float = 0.0, top_k: int = 40,
                 seed: int = 0) -> None:
        import llama_cpp

        self._llama = llama
        self._ctx = llama._ctx.ctx
        if not llama_cpp.llama_memory_can_shift(lowlevel.memory(self._ctx)):
            raise ShiftUnsupported("this model's KV cache cannot shift positions")
        self.n_ctx = min(int(llama.n_ctx()), len(llama.input_ids))
        self.sinks = sinks
        self.discard = discard or default_discard(self.n_ctx, sinks)
        plan(self.n_ctx, 1, self.n_ctx, sinks, self.discard)  # validates the sizes
        self.journal = Journal(journal_bytes)
        self.window: list[int] = []
        self.shifts = 0
        self.produced = 0
        self._batch = lowlevel.Batch(int(llama.n_batch))
        self._sampler = self._chain(temperature, top_k, seed)

    @staticmethod
    def _chain(temperature: float, top_k: int, seed: int) -> Any:
        import llama_cpp

        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if temperature <= 0:
            parts = [llama_cpp.llama_sampler_init_greedy()]
        else:
            parts = [llama_cpp.llama_sampler_init_top_k(top_k),
                     llama_cpp.llama_sampler_init_temp(temperature),
                     llama_cpp.llama_sampler_init_dist(seed)]
        for part in parts:
            llama_cpp.llama_sampler_chain_add(chain, part)  # the chain owns it
        return chain

    def _make_room(self, incoming: int) -> None:
        shift = plan(len(self.window), incoming, self.n_ctx, self.sinks, self.discard)
        if shift is None:
            return
        shift_cache(self._ctx, shift)
        self.window = apply(self.window, shift)
        self.shifts += 1

    def _evaluate(self, tokens: Sequence[int]) -> int:
        """Evaluate `tokens` after the window; the batch index with logits."""
        row = -1
        for offset in range(0, len(tokens), self._batch.size):
            chunk = tokens[offset:offset + self._batch.size]
            self._make_room(len(chunk))
            last = offset + len(chunk) == len(tokens)
            base = len(self.window)
            rows = self._batch.decode(self._ctx, [(t, base + i, 0, last and i == len(chunk) - 1)
                                                  for i, t in enumerate(chunk)])
            self.window.extend(chunk)
            row = rows[-1] if rows else row
        return row

    def evaluate(self, tokens: Sequence[int]) -> Any:
        """Append `tokens` to the window (shifting as needed); a copy of the
        logits after the last one."""
        row = self._evaluate(tokens)
        return lowlevel.logits(self._ctx, row, self._llama._model.n_vocab()).copy()

    def run(self, prompt: Sequence[int], max_tokens: int, *,
            stop_at_eog: bool = False) -> Iterator[str]:
        """Start a fresh stream after `prompt`; yield text pieces until
        `max_tokens` tokens (any number of contexts long)."""
        import llama_cpp

        if not prompt:
            raise ValueError("empty prompt")
        lowlevel.truncate(self._ctx, 0, 0)
        self.window = []
        llama_cpp.llama_sampler_reset(self._sampler)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        vocab = self._llama._model.vocab
        row = self._evaluate(prompt)
        for _ in range(max_tokens):
            # llama_sampler_sample also feeds the token to the chain.
            token = int(llama_cpp.llama_sampler_sample(self._sampler, self._ctx, row))
            if stop_at_eog and llama_cpp.llama_vocab_is_eog(vocab, token):
                break
            self.produced += 1
            text = decoder.decode(self._llama.detokenize([token], special=False))
            if text:
                self.journal.append(text)
                yield text
            row = self._evaluate([token])
        tail = decoder.decode(b"", final=True)
        if tail:
            self.journal.append(tail)
            yield tail
        lowlevel.sync(self._llama, self.window)

    def close(self) -> None:
        import llama_cpp

        self._batch.close()
        if self._sampler is not None:
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None
