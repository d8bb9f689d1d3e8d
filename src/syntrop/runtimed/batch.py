"""Decoding several sequences in one llama.cpp batch, and the low-level
helpers the other decoding modules (speculative.py, sinks.py) share.

llama-cpp-python's `Llama.eval` drives sequence 0 only, one logits row at a
time; these helpers fill a raw `llama_batch` instead, so a caller chooses the
sequence id, position and logits flag of every token. They work on a
`Llama`'s own context (`llama._ctx.ctx`) and leave its `input_ids`/`n_tokens`
bookkeeping to the caller (`sync`).

Everything here blocks; llama_cpp is imported inside the functions.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: One token of a batch: (token, position, sequence id, wants logits).
Entry = tuple[int, int, int, bool]


class DecodeError(Exception):
    """llama_decode failed (no room in the KV cache, or an error)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"llama_decode returned {code}")
        self.code = code


@dataclass(slots=True)
class Batch:
    """A reusable raw llama_batch of at most `size` tokens."""

    size: int
    raw: Any = None

    def __post_init__(self) -> None:
        import llama_cpp

        self.raw = llama_cpp.llama_batch_init(self.size, 0, 1)

    def close(self) -> None:
        import llama_cpp

        if self.raw is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None

    def decode(self, ctx: Any, entries: Sequence[Entry]) -> list[int]:
        """Evaluate `entries` in one llama_decode; the batch indices that
        have logits, in order (for `logits`)."""
        import llama_cpp

        if len(entries) > self.size:
            raise ValueError(f"{len(entries)} tokens, batch of {self.size}")
        raw = self.raw
        rows = []
        for i, (token, pos, seq, wants) in enumerate(entries):
            raw.token[i] = token
            raw.pos[i] = pos
            raw.n_seq_id[i] = 1
            raw.seq_id[i][0] = seq
            raw.logits[i] = wants
            if wants:
                rows.append(i)
        raw.n_tokens = len(entries)
        code = int(llama_cpp.llama_decode(ctx, raw))
        if code != 0:
            raise DecodeError(code)
        return rows


def logits(ctx: Any, index: int, n_vocab: int) -> Any:
    """The logits row of batch index `index` of the last decode, as a numpy
    view (valid until the next decode)."""
    import llama_cpp
    import numpy as np

    pointer = llama_cpp.llama_get_logits_ith(ctx, index)
    return np.ctypeslib.as_array(pointer, shape=(n_vocab,))


def memory(ctx: Any) -> Any:
    import llama_cpp

    return llama_cpp.llama_get_memory(ctx)


def truncate(ctx: Any, seq: int, keep: int) -> None:
    """Drop the KV cells of `seq` at positions >= `keep` (O(1) rollback:
    nothing is re-evaluated)."""
    import llama_cpp

    llama_cpp.llama_memory_seq_rm(memory(ctx), seq, keep, -1)


def sync(llama: Any, tokens: Sequence[int]) -> None:
    """Tell a `Llama` that `tokens` are resident in sequence 0, so its own
    prefix reuse (`Llama.generate`) sees what the helpers evaluated."""
    count = min(len(tokens), len(llama.input_ids))
    llama.input_ids[:count] = tokens[:count]
    llama.n_tokens = count
    llama._requires_eval = True


def prefill(ctx: Any, batch: Batch, tokens: Sequence[int], start: int, seq: int = 0) -> int:
    """Evaluate `tokens` at positions start.. of `seq` in chunks of the
    batch size, logits for the last one only; its batch index."""
    row = -1
    for offset in range(0, len(tokens), batch.size):
        chunk = tokens[offset:offset + batch.size]
        last = offset + len(chunk) == len(tokens)
        entries = [(t, start + offset + i, seq, last and i == len(chunk) - 1)
                   for i, t in enumerate(chunk)]
        rows = batch.decode(ctx, entries)
        if rows:
            row = rows[-1]
    return row


class BatchFull(Exception):
    """Every sequence of the context is in use."""


@dataclass(slots=True, eq=False)
class Request:
    """One generation sharing the batch; `tokens` grows step by step."""

    prompt: list[int]
    max_tokens: int
    seq: int = -1
    tokens: list[int] = field(default_factory=list)
    #: None while running; then "stop" (end of generation) or "length".
    reason: str | None = None
    sampler: Any = None
    #: Position of the next token, and the token to evaluate next.
    n_past: int = 0
    pending: int | None = None

    @property
    def done(self) -> bool:
        return self.reason is not None


class Batcher:
    """Continuous batching on one llama.cpp context with `n_seq` sequences.

    Each `step` builds one batch: the last sampled token of every running
    request plus the prompts of requests admitted since the last step (as
    far as the batch holds them), runs one llama_decode, and samples one
    token per sequence with that request's own sampler chain. Requests
    `submit`ted from any thread join at the next step; a finished request's
    sequence is cleared and reused. The context is made from `llama`'s model
    (weights shared), each sequence `n_ctx_seq` tokens long, KV cache not
    unified (each sequence attends over its own cells)."""

    def __init__(self, llama: Any, *, n_seq: int = 8, n_ctx_seq: int = 512,
                 n_batch: int = 512, threads: int = 0) -> None:
        import os
        import threading

        import llama_cpp

        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx_seq * n_seq
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = threads or (os.cpu_count() or 1)
        self._ctx = llama_cpp.llama_init_from_model(llama._model.model, params)
        if not self._ctx:
            raise DecodeError(-1)
        self._llama = llama
        self._vocab = llama._model.vocab
        self.n_seq, self.n_ctx_seq = n_seq, n_ctx_seq
        self._batch = Batch(n_batch)
        self._lock = threading.Lock()
        self._queue: list[Request] = []
        self._running: list[Request] = []
        self._free = list(range(n_seq))

    @property
    def free_slots(self) -> int:
        with self._lock:
            return len(self._free) - len(self._queue)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._queue or self._running)

    def submit(self, prompt: Sequence[int], max_tokens: int, *, temperature: float = 0.0,
               top_k: int = 40, seed: int = 0) -> Request:
        """Queue a request; it starts at the next step with a free sequence."""
        import llama_cpp

        if not prompt or len(prompt) > min(self._batch.size, self.n_ctx_seq - 1):
            raise ValueError(f"prompt of {len(prompt)} tokens: 1 to "
                             f"{min(self._batch.size, self.n_ctx_seq - 1)}")
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        parts = ([llama_cpp.llama_sampler_init_greedy()] if temperature <= 0 else
                 [llama_cpp.llama_sampler_init_top_k(top_k),
                  llama_cpp.llama_sampler_init_temp(temperature),
                  llama_cpp.llama_sampler_init_dist(seed)])
        for part in parts:
            llama_cpp.llama_sampler_chain_add(chain, part)
        request = Request(prompt=list(prompt), max_tokens=max_tokens, sampler=chain)
        with self._lock:
            self._queue.append(request)
        return request

    def _finish(self, request: Request, reason: str) -> None:
        import llama_cpp

        request.reason = reason
        llama_cpp.llama_memory_seq_rm(memory(self._ctx), request.seq, -1, -1)
        llama_cpp.llama_sampler_free(request.sampler)
        request.sampler = None
        self._running.remove(request)
        with self._lock:
            self._free.append(request.seq)

    def step(self) -> int:
        """One decode for every running request; the tokens sampled."""
        import llama_cpp

        entries: list[Entry] = []
        owners: list[Request] = []
        for request in self._running:
            assert request.pending is not None
            entries.append((request.pending, request.n_past, request.seq, True))
            owners.append(request)
            request.n_past += 1
        with self._lock:
            while self._queue and self._free and \
                    len(entries) + len(self._queue[0].prompt) <= self._batch.size:
                request = self._queue.pop(0)
                request.seq = self._free.pop(0)
                self._running.append(request)
                last = len(request.prompt) - 1
                entries += [(t, i, request.seq, i == last) for i, t in enumerate(request.prompt)]
                owners.append(request)
                request.n_past = len(request.prompt)
        if not entries:
            return 0
        rows = self._batch.decode(self._ctx, entries)
        for request, row in zip(owners, rows, strict=True):
            token = int(llama_cpp.llama_sampler_sample(request.sampler, self._ctx, row))
            if llama_cpp.llama_vocab_is_eog(self._vocab, token):
                self._finish(request, "stop")
                continue
            request.tokens.append(token)
            request.pending = token
            if len(request.tokens) >= request.max_tokens or request.n_past + 1 >= self.n_ctx_seq:
                self._finish(request, "length")
        return len(rows)

    def run(self) -> None:
        """Step until every queued and running request is done."""
        while self.busy:
            self.step()

    def close(self) -> None:
        import llama_cpp

        for request in list(self._running):
            self._finish(request, "cancelled")
        with self._lock:
            queued, self._queue = self._queue, []
        for request in queued:
            request.reason = "cancelled"
            llama_cpp.llama_sampler_free(request.sampler)
        self._batch.close()
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
