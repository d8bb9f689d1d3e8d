"""A model's idle contexts inside its worker, kept for the prompts that
come back.

A stateless request (Chat, Complete) takes a context and gives it back when
it ends; the context keeps the KV of what it evaluated, and the next
generation on it re-evaluates only what differs from that (`Engine.generate`
reuses the common prefix). So which idle context a request takes decides
what it costs: a 1.5k-token system prompt is seconds of prefill on a small
CPU, and nothing when resident. `Pool.take` picks, for a prompt's tokens:

- the idle context sharing the longest prefix with them, when that is at
  least REUSE_MIN tokens;
- else a new context while fewer than `room` (runtimed's slots) exist, so
  the idle ones keep their prefixes for the requests that want them;
- else the least recently used one holding no chat prefix worth keeping
  (under KEEP_MIN tokens), else the least recently used one (its prefix is
  evicted).

The pool knows which chats each idle context holds (`Engine.prefixes`,
digests of syntrop.prefix) and reports them (`cache`), so that routers can
send a conversation where its start is resident. Tokens decide reuse;
digests are only what the pool says about it.

The contexts of one options share one load of the weights (`Weights`): a
new slot costs its KV cache, not another copy of the model. The weights are
freed when no context of theirs is left (`trim`, `close`).
"""

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from syntrop.runtimed.protocol import Kind, Options, Placed, WorkerError
from syntrop.runtimed.sessions import common_prefix
from syntrop.runtimed.worker.engine import Engine, LoadError, Weights

#: Tokens an idle context must share with a prompt to be taken for it
#: rather than a fresh one (below this, the reuse is a chat template's
#: opening and not worth a prefix evicted).
REUSE_MIN = 32
#: Tokens of a chat below which its prefix is not worth keeping (nor
#: reporting): about routerd's AFFINITY_STEP of 512 characters.
KEEP_MIN = 128
#: Most seconds a prompt waits for a stream's context that holds its prefix.
ENDING_WAIT = 2.0
#: What one decoded token costs in prompt tokens prefilled (a conservative
#: ratio: prefill batches, decode does not).
DECODE_COST = 8
#: The options of the pool's tokenizer (vocab_only: no weights, no KV).
TOKENIZER = Options(n_ctx=64, n_batch=64, n_threads=1)


@dataclass(slots=True, kw_only=True)
class Pool:
    """A model's verified descriptor and its idle contexts, by options."""

    name: str
    fd: int
    #: Idle contexts per options, least recently given back first.
    idle: dict[Options, list[Engine]] = field(default_factory=dict)
    #: Contexts made per options, idle or in use.
    made: dict[Options, int] = field(default_factory=dict)
    #: Contexts taken by `take`: id -> (options, the tokens they were
    #: taken for, the taker's cancel event, its token budget).
    busy: dict[int, tuple[Options, list[int], threading.Event | None, int]] = \
        field(default_factory=dict)
    lock: threading.Condition = field(default_factory=threading.Condition)
    #: Layout batch: the model's shared decode batch (batch.Batcher) and the
    #: small context that tokenizes for it.
    batcher: Any = None
    batch_engine: Engine | None = None
    #: SHA-256 over the vocabulary (speculative.vocabulary_digest), once.
    vocabulary: str | None = None
    #: Where its contexts run (the face's placement; None: the CPU).
    placed: Placed | None = None
    #: The weights its contexts run on, one load per options.
    weights: dict[Options, Weights] = field(default_factory=dict)
    #: Closed: contexts given back are closed, the weights freed with the last.
    closed: bool = False
    _tokenizer: Engine | None = None

    @classmethod
    def open(cls, name: str, fd: int, placed: Placed | None = None) -> "Pool":
        """Take ownership of `fd` once llama.cpp has loaded it (a non-GGUF or
        truncated file is Kind.INVALID_MODEL); closes `fd` on failure. The check
        loads it on the CPU; its contexts go where `placed` says."""
        try:
            probe = Engine.load(fd, Options(n_ctx=64, n_batch=64, n_threads=1))
        except LoadError as error:
            os.close(fd)
            raise WorkerError(Kind.INVALID_MODEL, model=name, reason=error.reason) from None
        except BaseException:
            os.close(fd)
            raise
        probe.close()
        return cls(name=name, fd=fd, placed=placed)

    def tokenizer(self) -> Engine:
        """The model's vocabulary, loaded once: it tokenizes prompts (and
        renders chats) before they have a context."""
        with self.lock:
            if self._tokenizer is None:
                try:
                    self._tokenizer = Engine.load(self.fd, TOKENIZER, vocab_only=True)
                except LoadError as error:
                    raise WorkerError(Kind.INVALID_MODEL,
                                      model=self.name, reason=error.reason) from None
            return self._tokenizer

    def take_idle(self, options: Options) -> Engine | None:
        """The idle context given back last, if there is one (no blocking)."""
        with self.lock:
            pool = self.idle.get(options)
            return pool.pop() if pool else None

    def take(self, options: Options, tokens: list[int] | None = None, room: int = 1,
             stop: threading.Event | None = None, budget: int = 0) -> Engine:
        """A context for a prompt of `tokens` (see the module's docstring);
        without them, the idle context given back last, or a new one.
        `stop` (the taker's cancel) and `budget` (the most tokens it may
        generate) say how soon the context comes back: a prompt whose
        prefix a stream about to end holds waits for it (see `_ending`)."""
        deadline = time.monotonic() + ENDING_WAIT
        with self.lock:
            while tokens is not None and self._ending(options, tokens) and \
                    (left := deadline - time.monotonic()) > 0:
                self.lock.wait(left)
            engine = self._choose(options, tokens, room)
            if engine is None:
                self.made[options] = self.made.get(options, 0) + 1
            else:
                engine.prefixes = ()  # what it holds changes now
                self.busy[id(engine)] = (options, tokens or [], stop, budget)
                return engine
            weights = self.weights.get(options)
            if weights is None:
                weights = self.weights[options] = Weights(self.fd, options, self.placed)
        try:
            engine = weights.context()
        except BaseException as error:
            with self.lock:
                self.made[options] -= 1
            if isinstance(error, LoadError):
                raise WorkerError(Kind.INVALID_MODEL,
                                  model=self.name, reason=error.reason) from None
            raise
        with self.lock:
            self.busy[id(engine)] = (options, tokens or [], stop, budget)
        return engine

    def _ending(self, options: Options, tokens: list[int]) -> bool:
        """Whether a context in use holds REUSE_MIN tokens more of `tokens`
        than any idle one, and its stream ends sooner than those tokens'
        prefill would take: it is cancelled, or it may generate fewer than
        1/DECODE_COST of them (a client that reads the first token of a
        short answer and asks again at once)."""
        idle = max((common_prefix(e.resident(), tokens) for e in self.idle.get(options) or ()),
                   default=0)
        for held_options, held, stop, budget in self.busy.values():
            gain = common_prefix(held, tokens) - idle
            if held_options == options and gain >= REUSE_MIN and (
                    (stop is not None and stop.is_set()) or budget * DECODE_COST < gain):
                return True
        return False

    def _choose(self, options: Options, tokens: list[int] | None, room: int) -> Engine | None:
        """The idle context to take (None: make one); under the lock."""
        idle = self.idle.get(options) or []
        if not idle:
            return None
        if tokens is None:
            return idle.pop()
        shared = [common_prefix(e.resident(), tokens) for e in idle]
        best = max(range(len(idle)), key=shared.__getitem__)  # ties: the oldest
        full = self.made.get(options, 0) >= room
        if shared[best] >= REUSE_MIN:
            return idle.pop(best)
        if not full:
            return None
        # Evict: what holds no prefix first, else the oldest.
        return idle.pop(next((i for i, e in enumerate(idle) if not e.prefixes), 0))

    def give(self, options: Options, engine: Engine) -> None:
        with self.lock:
            self.busy.pop(id(engine), None)
            if not self.closed:
                self.idle.setdefault(options, []).append(engine)
                self.lock.notify_all()
                return
            self.made[options] = self.made.get(options, 0) - 1
            unused = self._unused()
        engine.close()
        for weights in unused:
            weights.close()

    def cache(self) -> dict[str, Any]:
        """What the idle contexts hold, for routers: the chat prefixes'
        digests (syntrop.prefix) and how many contexts hold one."""
        with self.lock:
            held = [e.prefixes for pool in self.idle.values() for e in pool if e.prefixes]
        return {"prefixes": sorted({d for digests in held for d in digests}),
                "cached_contexts": len(held)}

    def trim(self) -> int:
        """Close the idle contexts kept for later requests, and the weights
        no context uses any more; how many contexts."""
        with self.lock:
            pools, self.idle = self.idle, {}
            for options, pool in pools.items():
                self.made[options] = self.made.get(options, 0) - len(pool)
            unused = self._unused()
        engines = [engine for pool in pools.values() for engine in pool]
        for engine in engines:
            engine.close()
        for weights in unused:
            weights.close()
        return len(engines)

    def _unused(self) -> list[Weights]:
        """Take out the weights no context uses (under the lock)."""
        unused = [options for options in self.weights if self.made.get(options, 0) <= 0]
        return [self.weights.pop(options) for options in unused]

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None
        for engine in (self.batch_engine, self._tokenizer):
            if engine is not None:
                engine.close()
        self.batch_engine = self._tokenizer = None
        with self.lock:
            self.closed = True  # contexts still in use close when given back
        self.trim()
        os.close(self.fd)
