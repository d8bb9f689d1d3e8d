"""Decoding several sequences in one llama.cpp batch, and the low-level
helpers the other decoding modules (speculative.py, sinks.py) share.

llama-cpp-python's `Llama.eval` drives sequence 0 only, one logits row at a
time; these helpers fill a raw `llama_batch` instead, so a caller chooses the
sequence id, position and logits flag of every token. They work on a
`Llama`'s own context (`llama._ctx.ctx`) and leave its `input_ids`/`n_tokens`
bookkeeping to the caller (`sync`).

`Batcher` runs continuous batching on top of them: many requests, one
sequence each, sharing every llama_decode.

Everything here blocks (a started `Batcher` steps in a thread of its own);
llama_cpp and numpy are imported inside the functions.
"""

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from syntrop.runtimed.sampling import MAX_SEED

logger = logging.getLogger(__name__)

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


#: A llama-cpp-python style logits processor: (input_ids, scores) -> scores.
Processor = Callable[[Any, Any], Any]
#: A sampler of a chain: the name after `llama_sampler_init_` and its arguments.
Stage = tuple[str, tuple[float, ...]]



def sampler_stages(*, temperature: float, top_k: int, top_p: float, min_p: float,
                   seed: int) -> list[Stage]:
    """The sampler chain of one request, in llama-cpp-python's order
    (`Llama._init_sampler` without penalties, grammar or mirostat):
    greedy at temperature 0, else top-k, typical (1.0: off), top-p, min-p,
    temperature and a seeded draw. Raises ValueError naming a bad value."""
    if not 0.0 <= temperature < float("inf"):
        raise ValueError(f"temperature {temperature}: 0 or more")
    if top_k < 0:
        raise ValueError(f"top_k {top_k}: 0 (all) or more")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p {top_p}: greater than 0, at most 1")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p {min_p}: 0 to 1")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed {seed}: 0 to {MAX_SEED}")
    if temperature == 0.0:
        return [("greedy", ())]
    return [("top_k", (top_k,)), ("typical", (1.0, 1)), ("top_p", (top_p, 1)),
            ("min_p", (min_p, 1)), ("temp", (temperature,)), ("dist", (seed,))]


def share(room: int, remaining: Sequence[int]) -> list[int]:
    """Chunked prefill: how many of their remaining prompt tokens the
    prefilling requests (in admission order) feed into `room` batch slots
    left by the decoding ones; first come, first served."""
    takes = []
    for left in remaining:
        take = max(0, min(left, room))
        takes.append(take)
        room -= take
    return takes


@dataclass(slots=True, eq=False)
class Request:
    """One generation sharing the batch; `tokens` grows step by step (in
    the driver thread). Done once `reason` is set: "stop" (end of
    generation, or `on_token` returned False), "length" (max_tokens, or the
    sequence is full), "cancelled", or "error" (see `error`). `on_token`
    gets each token and, with `logits`, the raw row it was sampled from
    (before the processors; valid during the call), else None."""

    prompt: list[int]
    max_tokens: int
    processors: tuple[Processor, ...] = ()
    on_token: Callable[[int, Any], bool] | None = None
    logits: bool = False
    tokens: list[int] = field(default_factory=list)
    reason: str | None = None
    #: What made it finish with "error": a DecodeError, or what a processor
    #: or on_token raised.
    error: BaseException | None = None
    seq: int = -1
    sampler: Any = None
    #: Tokens of the sequence in the KV cache; the sampled token evaluated
    #: next (None while the prompt is being fed).
    n_past: int = 0
    pending: int | None = None
    #: The prompt and the tokens so far, as np.intc (with processors only).
    ids: Any = None
    cancelled: bool = False
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self.reason is not None

    def cancel(self) -> None:
        """Finish at the next step with reason "cancelled" (any thread; no-op
        once done)."""
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (or `timeout` seconds); whether it is done."""
        return self.finished.wait(timeout)


def context_params(llama: Any, *, n_seq: int, n_ctx_seq: int, n_batch: int,
                   threads: int) -> Any:
    """Parameters of a context of `n_seq` sequences of `n_ctx_seq` tokens
    each (KV cache not unified) over `llama`'s model, with `llama`'s KV
    cache types and RoPE settings, and flash attention wherever llama.cpp
    has it (whatever `llama` uses): without it the logits of a token
    depend on how many rows its batch holds (1 or more), so a request's
    output would depend on its neighbours. Given the same batches, a
    sequence decodes exactly as a `Llama` with flash_attn=True does."""
    import llama_cpp

    params = type(llama.context_params).from_buffer_copy(llama.context_params)
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
    params.n_ctx = n_ctx_seq * n_seq
    params.n_batch = params.n_ubatch = n_batch
    params.n_seq_max = n_seq
    params.kv_unified = False
    params.n_threads = params.n_threads_batch = threads
    return params


class Batcher:
    """Continuous batching on one llama.cpp context with `n_seq` sequences.

    Each step builds one batch: the last sampled token of every decoding
    request, then as much of the prompts of newly admitted requests as fits
    (a prompt longer than the room is fed over several steps, logits for
    its last token only), runs one llama_decode, and samples one token per
    finished prompt or decoding request with that request's own sampler
    chain, after its logits processors. Requests `submit`ted from any thread
    take a free sequence at the next step; a finished request's sequence is
    cleared and reused. The context is made from `llama`'s model (weights
    shared), each sequence `n_ctx_seq` tokens long, KV cache not unified
    (each sequence attends over its own cells), so a request's output does
    not depend on its neighbours.

    Steps run in the caller (`step`, `run`) or, after `start`, only in a
    driver thread that sleeps while there is no work."""

    def __init__(self, llama: Any, *, n_seq: int = 8, n_ctx_seq: int = 512,
                 n_batch: int = 512, threads: int = 0) -> None:
        import llama_cpp

        if n_seq < 1 or n_ctx_seq < 2 or n_batch < n_seq or threads < 0:
            raise ValueError(f"n_seq {n_seq} >= 1, n_ctx_seq {n_ctx_seq} >= 2, "
                             f"n_batch {n_batch} >= n_seq, threads {threads} >= 0")
        self._threads = threads or (os.cpu_count() or 1)
        params = context_params(llama, n_seq=n_seq, n_ctx_seq=n_ctx_seq, n_batch=n_batch,
                                threads=self._threads)
        self._ctx = llama_cpp.llama_init_from_model(llama._model.model, params)
        if not self._ctx:
            raise DecodeError(-1)
        self._applied_threads = self._threads
        # llama.cpp pads the context (to 256 cells a sequence here); never
        # go past what each sequence really has, should it give less.
        n_ctx_seq = min(n_ctx_seq, int(llama_cpp.llama_n_ctx_seq(self._ctx)))
        self._memory = memory(self._ctx)
        self._vocab = llama._model.vocab
        self._n_vocab = int(llama._model.n_vocab())
        self.n_seq, self.n_ctx_seq = n_seq, n_ctx_seq
        self._batch = Batch(n_batch)
        #: Guards the queue, the running list, the free sequences and the
        #: driver's state; the driver sleeps on it.
        self._lock = threading.Condition()
        self._queue: list[Request] = []
        #: Requests holding a sequence, in admission order (prefill order).
        self._running: list[Request] = []
        self._free = list(range(n_seq))
        self._thread: threading.Thread | None = None
        self._closing = False
        self._closed = False

    @property
    def free_slots(self) -> int:
        """Sequences neither running nor claimed by a queued request."""
        with self._lock:
            return max(0, len(self._free) - len(self._queue))

    @property
    def running(self) -> int:
        """Requests holding a sequence (feeding their prompt or decoding)."""
        with self._lock:
            return len(self._running)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._queue or self._running)

    @property
    def threads(self) -> int:
        return self._threads

    def set_threads(self, n: int) -> None:
        """Use `n` threads (0: one per CPU) from the next decode on."""
        if n < 0:
            raise ValueError(f"threads {n}: 0 (one per CPU) or more")
        self._threads = n or (os.cpu_count() or 1)

    def submit(self, prompt: Sequence[int], max_tokens: int, *, temperature: float = 0.0,
               top_k: int = 40, top_p: float = 1.0, min_p: float = 0.0, seed: int = 0,
               processors: Sequence[Processor] = (),
               on_token: Callable[[int, Any], bool] | None = None,
               logits: bool = False) -> Request:
        """Queue a request (any thread); it starts at the next step that has
        a free sequence. ValueError for a prompt empty or of n_ctx_seq
        tokens or more, a token outside the vocabulary, or a bad setting.
        With `logits`, `on_token` gets each token's raw logits row too
        (see `Request`)."""
        import llama_cpp

        if not prompt or len(prompt) >= self.n_ctx_seq:
            raise ValueError(f"prompt of {len(prompt)} tokens: 1 to {self.n_ctx_seq - 1}")
        if not 0 <= min(prompt) <= max(prompt) < self._n_vocab:
            raise ValueError(f"prompt tokens: 0 to {self._n_vocab - 1}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens {max_tokens}: 1 or more")
        stages = sampler_stages(temperature=temperature, top_k=top_k, top_p=top_p,
                                min_p=min_p, seed=seed)
        request = Request(prompt=[int(t) for t in prompt], max_tokens=max_tokens,
                          processors=tuple(processors), on_token=on_token, logits=logits)
        if request.processors:
            import numpy as np

            request.ids = np.empty(min(len(prompt) + max_tokens, self.n_ctx_seq), np.intc)
            request.ids[:len(prompt)] = request.prompt
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        for name, args in stages:
            llama_cpp.llama_sampler_chain_add(
                chain, getattr(llama_cpp, f"llama_sampler_init_{name}")(*args))
        request.sampler = chain
        with self._lock:
            if self._closing:
                llama_cpp.llama_sampler_free(chain)
                raise RuntimeError("the batcher is closed")
            self._queue.append(request)
            self._lock.notify()
        return request

    @property
    def alive(self) -> bool:
        """Whether the batcher takes requests (not closed, its driver not dead)."""
        with self._lock:
            return not self._closing

    def start(self) -> None:
        """Step in a background thread from now on: while there is work,
        asleep otherwise (`submit` wakes it)."""
        with self._lock:
            if self._closing:
                raise RuntimeError("the batcher is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._drive, name="batcher", daemon=True)
                self._thread.start()

    def _drive(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._closing and not (self._queue or self._running):
                        self._lock.wait()
                    if self._closing:
                        return
                try:
                    self._step()
                except Exception as error:  # a bug: fail what runs, keep serving
                    logger.exception("batch step failed")
                    for request in list(self._running):
                        self._finish(request, "error", error)
        finally:
            self._teardown()

    def _finish(self, request: Request, reason: str, error: BaseException | None = None) -> None:
        import llama_cpp

        if request.seq >= 0:
            llama_cpp.llama_memory_seq_rm(self._memory, request.seq, -1, -1)
        if request.sampler is not None:
            llama_cpp.llama_sampler_free(request.sampler)
            request.sampler = None
        with self._lock:
            if request.seq >= 0:
                self._running.remove(request)
                self._free.append(request.seq)
        request.error = error
        request.reason = reason
        request.finished.set()

    def step(self) -> int:
        """One decode for every running request; the tokens sampled. Only
        without `start` (the driver thread steps then)."""
        if self._thread is not None or self._closing:
            raise RuntimeError("the batcher is driven by its thread, or closed")
        return self._step()

    def run(self) -> None:
        """Step until every queued and running request is done."""
        while self.busy:
            self.step()

    def _admit(self) -> list[Request]:
        """Give free sequences to queued requests; the cancelled requests,
        queued or running, to finish."""
        with self._lock:
            cancelled = [r for r in self._queue if r.cancelled]
            if cancelled:
                self._queue = [r for r in self._queue if not r.cancelled]
            while self._queue and self._free:
                request = self._queue.pop(0)
                request.seq = self._free.pop(0)
                self._running.append(request)
            return cancelled + [r for r in self._running if r.cancelled]

    def _step(self) -> int:
        import llama_cpp

        for request in self._admit():
            self._finish(request, "cancelled")
        # Only the stepping thread adds to or removes from _running.
        decoding = [r for r in self._running if r.pending is not None]
        prefilling = [r for r in self._running if r.pending is None]
        entries: list[Entry] = [(r.pending, r.n_past, r.seq, True)
                                for r in decoding if r.pending is not None]
        owners = list(decoding)
        fed: list[tuple[Request, int]] = []
        takes = share(self._batch.size - len(entries),
                      [len(r.prompt) - r.n_past for r in prefilling])
        for request, take in zip(prefilling, takes, strict=True):
            if not take:
                continue
            start, end = request.n_past, request.n_past + take
            entries += [(request.prompt[i], i, request.seq, False) for i in range(start, end)]
            if end == len(request.prompt):
                entries[-1] = (request.prompt[-1], end - 1, request.seq, True)
                owners.append(request)
            fed.append((request, take))
        if not entries:
            return 0
        if self._threads != self._applied_threads:
            llama_cpp.llama_set_n_threads(self._ctx, self._threads, self._threads)
            self._applied_threads = self._threads
        try:
            rows = self._batch.decode(self._ctx, entries)
        except DecodeError as error:
            for request in decoding + [r for r, _ in fed]:
                self._finish(request, "error", error)
            return 0
        for request in decoding:
            request.n_past += 1
        for request, take in fed:
            request.n_past += take
        for request, row in zip(owners, rows, strict=True):
            self._sample(request, row)
        return len(rows)

    def _sample(self, request: Request, row: int) -> None:
        import llama_cpp

        try:
            raw = None
            if request.logits:
                raw = logits(self._ctx, row, self._n_vocab)
                if request.processors:  # they rewrite the row in place
                    raw = raw.copy()
            if request.processors:
                scores = logits(self._ctx, row, self._n_vocab)
                ids = request.ids[:len(request.prompt) + len(request.tokens)]
                for processor in request.processors:
                    result = processor(ids, scores)
                    if result is not scores:
                        scores[:] = result
            token = int(llama_cpp.llama_sampler_sample(request.sampler, self._ctx, row))
            if llama_cpp.llama_vocab_is_eog(self._vocab, token):
                self._finish(request, "stop")
                return
            request.tokens.append(token)
            request.pending = token
            if request.ids is not None:
                request.ids[len(request.prompt) + len(request.tokens) - 1] = token
            if request.on_token is not None and request.on_token(token, raw) is False:
                self._finish(request, "stop")
                return
        except Exception as error:
            self._finish(request, "error", error)
            return
        if len(request.tokens) >= request.max_tokens or \
                len(request.prompt) + len(request.tokens) >= self.n_ctx_seq:
            self._finish(request, "length")

    def close(self) -> None:
        """Stop the driver thread, cancel every request, free the context
        (idempotent)."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            thread = self._thread
        if thread is None:
            self._teardown()
        elif thread is not threading.current_thread():
            thread.join()

    def _teardown(self) -> None:
        import llama_cpp

        with self._lock:
            if self._closed:
                return
            # Also when the driver thread ends unexpectedly: refuse new work.
            self._closed = self._closing = True
            queued, self._queue = self._queue, []
        for request in queued + list(self._running):
            self._finish(request, "cancelled")
        self._batch.close()
        llama_cpp.llama_free(self._ctx)
        self._ctx = None
