"""One model's engine, inside its worker process (worker/loop.py).

A Host holds everything of llama.cpp that belongs to one model: the
verified descriptor, a pool of idle contexts for stateless requests, the
shared decode batch (layout batch), draft models for speculative decoding,
and the context of each session opened on the model. runtimed's Varlink
face (service.py) decides who may run and when (slots, queue, keep-alive,
spills); the host only runs what it is sent.

Every method blocks (the worker calls it on a thread of its own) and takes
and returns plain JSON values; declared failures are raised as
protocol.WorkerError (a kind and its parameters), which the worker hands on
and the face turns into the Runtime1 error the client sees. Streams get
a `Sink`: `emit` for text, `think` for thinking text
(each with its tokens' logprob entries when the stream asked for them),
`first` when the first token is sampled, and `stop`, set when runtimed
cancels the call.
"""

import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from syntrop.prefix import reported
from syntrop.runtimed import protocol
from syntrop.runtimed import sessions as sessions_mod
from syntrop.runtimed.layout import Pace
from syntrop.runtimed.protocol import Kind, Options, Placed, WorkerError
from syntrop.runtimed.sampling import Params
from syntrop.runtimed.worker import handoff
from syntrop.runtimed.worker.engine import Engine, EngineError, LoadError, Output, Overflow
from syntrop.runtimed.worker.pool import KEEP_MIN, Pool
from syntrop.runtimed.worker.saved import memfd_of, read_saved

if TYPE_CHECKING:
    from syntrop.runtimed import constrain
    from syntrop.runtimed.worker.batch import Batcher
    from syntrop.runtimed.worker.reasoning import Reasoning
    from syntrop.runtimed.worker.sinks import Window

logger = logging.getLogger(__name__)

#: Default tokens drafted per speculative step.
DRAFT_MAX = 8
Prompt = Callable[[Engine], tuple[list[int], tuple[str, ...]]]


class Sink(Protocol):
    """Where a stream's pieces go (worker.py sends them to runtimed)."""

    stop: threading.Event

    def emit(self, text: str, tokens: int,
             logprobs: list[dict[str, Any]] | None = None) -> None: ...
    def think(self, text: str, tokens: int,
              logprobs: list[dict[str, Any]] | None = None) -> None: ...
    def first(self) -> None: ...


@dataclass(slots=True, kw_only=True)
class SessionContext:
    """A session's context in this worker (None while spilled)."""

    options: Options
    engine: Engine | None
    lora_fd: int | None = None
    lora_scale: float = 1.0
    #: With sinks: the sliding window (runtimed keeps the journal).
    window: "Window | None" = None


@dataclass(slots=True)
class Counts:
    """What a stream's last chunk reports besides its text."""

    reasoning: "Reasoning | None" = None
    drafted: int | None = None
    accepted: int | None = None
    shifted: int | None = None
    #: Tokens of the prompt as the model saw it (chat template applied).
    prompt: int | None = None
    #: Of those, the ones whose KV the context already held (not evaluated).
    cached: int | None = None

    def extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"drafted_tokens": self.drafted,
                                 "accepted_tokens": self.accepted,
                                 "shifted_tokens": self.shifted,
                                 "prompt_tokens": self.prompt,
                                 "cached_tokens": self.cached}
        if self.reasoning is not None:
            extra.update(thinking_tokens=self.reasoning.thinking_tokens,
                         answer_tokens=self.reasoning.answer_tokens)
        return extra


def _processor(engine: Engine, compiled: "constrain.Constraint | None") -> Any:
    return None if compiled is None else engine.guide(compiled)


def _reasoning(engine: Engine, params: Params) -> "Reasoning | None":
    """The request's thinking budget on `engine`, or InvalidSampling for a
    model without single-token thinking markers."""
    if params.reasoning_budget is None:
        return None
    from syntrop.runtimed.worker.reasoning import ReasoningError

    try:
        return engine.reasoning(params.reasoning_budget)
    except ReasoningError as error:
        raise WorkerError(Kind.INVALID_SAMPLING,
                          parameter="reasoning_budget", reason=error.reason) from None


def pin(cpus: Sequence[int]) -> None:
    """Pin every thread of this process (and so the threads they start)
    to `cpus`."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended
            os.sched_setaffinity(int(task), cpus)


class Host:
    """One model's contexts, batch, drafts and sessions in this worker."""

    def __init__(self, pace: Pace, *, layout: str, slots: int, n_threads: int) -> None:
        self.pace = pace
        self.layout = layout
        self.slots = slots
        self.n_threads = n_threads
        self.model: Pool | None = None
        self.drafts: dict[str, Pool] = {}
        self.seats: dict[str, SessionContext] = {}
        self._lock = threading.Lock()
        self._loading_draft = threading.Lock()

    # models -------------------------------------------------------------------

    def load(self, name: str, fd: int, placed: Placed | None = None) -> dict[str, Any]:
        """The worker's model, its contexts where `placed` says: the worker
        pinned to its CPUs, if it names them, and no context or batch with
        more threads than it allows. Answers the placement applied, its
        threads as a context loaded now gets them."""
        if self.model is not None:
            os.close(fd)
            raise WorkerError(Kind.INVALID_PARAMETER, parameter="model")
        placed = placed or Placed()
        if placed.cpu_affinity:
            try:
                pin(placed.cpu_affinity)
            except OSError as error:  # CPUs outside this cgroup's cpuset
                logger.warning("not pinned to CPUs %s: %s", list(placed.cpu_affinity), error)
                placed = dataclasses.replace(placed, cpu_affinity=None,
                                             why=f"{placed.why}; not pinned: {error}")
        if placed.n_threads:
            self.n_threads = min(self.n_threads, placed.n_threads)
            self.pace.cpus = min(self.pace.cpus, placed.n_threads)
        self.model = Pool.open(name, fd, placed)
        from syntrop.runtimed.cpu import plane_threads

        kwargs = placed.llama_kwargs(plane_threads())
        return {"placement": {**placed.to_wire(), "n_threads": kwargs["n_threads"]}}

    def load_draft(self, name: str, fd: int) -> dict[str, Any]:
        with self._loading_draft:  # two first uses at once load it once
            with self._lock:
                known = name in self.drafts
            if known:
                os.close(fd)
                return {}
            pool = Pool.open(name, fd)
            with self._lock:
                self.drafts[name] = pool
        return {}

    def _pool(self) -> Pool:
        if self.model is None:
            raise WorkerError(Kind.INVALID_PARAMETER, parameter="model")
        return self.model

    def trim(self) -> dict[str, Any]:
        pools = [self._pool(), *self.drafts.values()]
        return {"closed": sum(pool.trim() for pool in pools)}

    def close(self) -> None:
        for seat in list(self.seats.values()):
            if seat.engine is not None:
                seat.engine.close()
        self.seats.clear()
        for pool in [*self.drafts.values(), *([self.model] if self.model else [])]:
            pool.close()
        self.drafts.clear()
        self.model = None

    # streams ------------------------------------------------------------------

    def generate(self, request: protocol.Generate, sink: Sink,
                 fds: list[int]) -> dict[str, Any]:
        """A completion (`prompt.text`) or chat (`prompt.messages`) stream;
        fds[0], if any, a prefill handed in for its prompt (handoff.py)."""
        options = request.options
        saved = handoff.handed(fds, request.digest, options.n_ctx,
                               lambda: self._pool().tokenizer().metadata)
        params, compiled, speculative = (request.decoding.params, request.decoding.constraint,
                                         request.decoding.speculative)
        pool = self._pool()
        turns: list[tuple[str, str]] | None = None
        if request.prompt.messages is not None:
            turns = list(request.prompt.messages)
            open_last = request.prompt.continue_last

            def prompt(engine: Engine) -> tuple[list[int], tuple[str, ...]]:
                try:
                    return engine.chat_prompt(turns, continue_last=open_last)
                except LoadError as error:
                    raise WorkerError(Kind.INVALID_MODEL,
                                      model=pool.name, reason=error.reason) from None
                except ValueError:
                    raise WorkerError(Kind.INVALID_PARAMETER, parameter="continue_last") from None
        else:
            text = request.prompt.text or ""

            def prompt(engine: Engine) -> tuple[list[int], tuple[str, ...]]:
                return engine.tokenize(text, add_bos=True), ()

        if self.layout == "batch" and speculative is None:
            batcher, engine = self._batcher(pool, options)
            counts = Counts(_reasoning(engine, params))
            reason = self._batched(batcher, engine, prompt, params, compiled, counts, sink)
            return {"reason": reason, **counts.extra()}
        tokens, stops = prompt(pool.tokenizer())
        if not tokens:
            raise WorkerError(Kind.INVALID_PARAMETER, parameter="prompt")
        engine = pool.take(options, tokens, room=self.slots, stop=sink.stop,
                           budget=params.max_tokens)
        restored = False
        try:
            counts = Counts(_reasoning(engine, params))
            restored = handoff.adopt(engine, saved, tokens) > 0
            saved = None  # its bytes are in the context now
            with contextlib.ExitStack() as held:
                drafter = None if speculative is None else \
                    self._drafter(speculative, engine, options, held)
                counts.prompt = len(tokens)
                # The engine evaluates the prompt from where the resident
                # tokens stop matching it, and its last token always.
                counts.cached = min(sessions_mod.common_prefix(engine.resident(), tokens),
                                    len(tokens) - 1)
                if speculative is not None:
                    reason, counts.drafted, counts.accepted = engine.speculate(
                        tokens, params, sink.stop, sink.emit, drafter=drafter,
                        draft_max=speculative.draft_max or DRAFT_MAX, extra_stops=stops,
                        pace=self.pace, first=sink.first)
                else:
                    reason = engine.generate(
                        tokens, params, sink.stop, sink.emit, extra_stops=stops, pace=self.pace,
                        first=sink.first, logits_processor=_processor(engine, compiled),
                        reasoning=counts.reasoning, think=sink.think)
            if turns is not None and reason != "cancelled" and len(tokens) >= KEEP_MIN \
                    and not restored:
                engine.prefixes = reported(turns)
        except Overflow as error:
            raise WorkerError(Kind.OVERFLOW, tokens=error.tokens, n_ctx=error.n_ctx) from None
        finally:
            if restored:  # its KV is this request's only
                handoff.forget(engine)
            pool.give(options, engine)
        return {"reason": reason, **counts.extra(), **pool.cache()}

    def _batched(self, batcher: "Batcher", engine: Engine, prompt: Prompt, params: Params,
                 compiled: "constrain.Constraint | None", counts: Counts, sink: Sink) -> str:
        """A stream as one sequence of the model's shared batch: submitted,
        then waited for, relaying a cancel."""
        tokens, stops = prompt(engine)
        if not tokens:
            raise WorkerError(Kind.INVALID_PARAMETER, parameter="prompt")
        counts.prompt = len(tokens)
        if len(tokens) >= batcher.n_ctx_seq:
            raise WorkerError(Kind.OVERFLOW, tokens=len(tokens), n_ctx=batcher.n_ctx_seq)
        output = Output(engine.llama, sink.emit, params.stop + stops, counts.reasoning,
                        sink.think, params.logprobs)
        processors = [*(_processor(engine, compiled) or ()),
                      *([counts.reasoning] if counts.reasoning is not None else [])]

        def on_token(token: int, logits: Any) -> bool:
            if output.count == 0:
                sink.first()
            return output.token(token, logits)

        request = batcher.submit(
            tokens, min(params.max_tokens, batcher.n_ctx_seq - len(tokens)),
            temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
            min_p=params.min_p, seed=params.seed, processors=processors, on_token=on_token,
            logits=output.scoring)
        while not request.wait(0.05):
            if sink.stop.is_set():
                request.cancel()
        if request.error is not None:
            raise request.error
        output.close()
        return str(request.reason)

    def _batcher(self, pool: Pool, options: Options) -> tuple["Batcher", Engine]:
        """The model's shared decode batch, made on first use: `slots`
        sequences of the configured window, and a small context of the same
        model that tokenizes for it."""
        with self._lock:
            if pool.batcher is not None and not pool.batcher.alive:
                logger.error("the shared batch of %s stopped; making a new one", pool.name)
                pool.batcher.close()
                pool.batcher = None
            if pool.batcher is None:
                from syntrop.runtimed.worker.batch import Batcher, DecodeError

                if pool.batch_engine is not None:
                    pool.batch_engine.close()
                    pool.batch_engine = None
                try:
                    engine = Engine.load(pool.fd, Options(n_ctx=64, n_batch=64, n_threads=1),
                                         placed=pool.placed)
                    try:
                        batcher = Batcher(engine.llama, n_seq=self.slots,
                                          n_ctx_seq=options.n_ctx,
                                          n_batch=max(options.n_batch, self.slots),
                                          threads=self.n_threads)
                    except BaseException:
                        engine.close()
                        raise
                except (LoadError, DecodeError, ValueError) as error:
                    raise WorkerError(Kind.INVALID_MODEL, model=pool.name,
                                      reason="cannot make its shared batch "
                                             f"({self.slots} x {options.n_ctx} tokens): "
                                             f"{error}") from None
                batcher.start()
                pool.batcher, pool.batch_engine = batcher, engine
            assert pool.batch_engine is not None
            return pool.batcher, pool.batch_engine

    def _drafter(self, spec: protocol.Speculation, engine: Engine, options: Options,
                 held: contextlib.ExitStack) -> Any:
        """Prompt lookup, or a draft model's context (given back when the
        stream ends) whose vocabulary was checked against the model's."""
        from syntrop.runtimed.worker import speculative as sp

        name = spec.draft
        if name is None:
            return sp.PromptLookup()
        target = self._pool()
        with self._lock:
            draft = self.drafts.get(name)
        if draft is None:  # runtimed sends a draft before its first use
            raise WorkerError(Kind.INVALID_PARAMETER, parameter="sampling.speculative.draft")
        draft_engine = draft.take(options)
        held.callback(draft.give, options, draft_engine)
        for pool, llama in ((target, engine.llama), (draft, draft_engine.llama)):
            if pool.vocabulary is None:
                pool.vocabulary = sp.vocabulary_digest(llama)
        try:
            sp.check_vocabulary(engine.llama, draft_engine.llama,
                                digests=(target.vocabulary, draft.vocabulary))
        except sp.VocabularyMismatch as error:
            raise WorkerError(Kind.VOCABULARY_MISMATCH, draft=name, reason=error.reason) from None
        drafter = sp.DraftModel(engine.llama, draft_engine.llama, checked=True)
        held.callback(drafter.close)  # before its context goes back to the pool
        return drafter

    def embed(self, request: protocol.Embed) -> dict[str, Any]:
        options = request.options
        pool = self._pool()
        engine = pool.take(options)
        try:
            vectors = engine.embed(list(request.input), self.pace)
        except Overflow as error:
            raise WorkerError(Kind.OVERFLOW, tokens=error.tokens, n_ctx=error.n_ctx) from None
        finally:
            pool.give(options, engine)
        return {"vectors": vectors}

    # sessions -----------------------------------------------------------------

    def _seat(self, session: str) -> SessionContext:
        with self._lock:
            seat = self.seats.get(session)
        if seat is None:
            raise WorkerError(Kind.SESSION_MISSING, session_id=session)
        return seat

    def _engine(self, session: str) -> Engine:
        seat = self._seat(session)
        if seat.engine is None:  # runtimed restores a spilled session first
            raise WorkerError(Kind.SESSION_MISSING, session_id=session)
        return seat.engine

    def _still(self, session: str, engine: Engine) -> None:
        """Under `engine.lock`: the session still has this context (not
        closed or spilled by a call that held the lock before)."""
        with self._lock:
            seat = self.seats.get(session)
        if seat is None or seat.engine is not engine:
            raise WorkerError(Kind.SESSION_MISSING, session_id=session)

    def _new_context(self, seat: SessionContext, adapter: str) -> Engine:
        """A context for a session, its adapter applied (AdapterMismatch,
        with the context closed, when the adapter does not fit)."""
        pool = self._pool()
        try:
            engine = Engine.load(pool.fd, seat.options, placed=pool.placed)
        except LoadError as error:
            raise WorkerError(Kind.INVALID_MODEL, model=pool.name, reason=error.reason) from None
        if seat.lora_fd is not None:
            from syntrop.runtimed.worker.lora import AdapterError

            try:
                engine.attach_lora(seat.lora_fd, seat.lora_scale)
            except AdapterError as error:
                engine.close()
                raise WorkerError(Kind.ADAPTER_MISMATCH,
                                  adapter=adapter, reason=error.reason[:512]) from None
        return engine

    def open(self, request: protocol.Open, fds: list[int]) -> dict[str, Any]:
        """A session's context (with its adapter, behind fds[0], when it has
        one); SHIFT_UNSUPPORTED for sinks on a cache that cannot shift."""
        session = request.session
        seat = SessionContext(options=request.options, engine=None,
                              lora_fd=fds[0] if fds else None, lora_scale=request.lora_scale)
        try:
            engine = self._new_context(seat, request.lora or "")
            declared = request.prompt_format
            if declared not in (None, "raw") and sessions_mod.template_format(
                    engine.metadata.get("tokenizer.chat_template")) != declared:
                engine.close()
                raise WorkerError(Kind.INVALID_PARAMETER, parameter="config.prompt_format")
            if request.sinks is not None:
                from syntrop.runtimed.journal import Journal
                from syntrop.runtimed.worker.sinks import Window

                if not engine.can_shift():
                    engine.close()
                    raise WorkerError(Kind.SHIFT_UNSUPPORTED, model=self._pool().name)
                # runtimed keeps the session's journal; this one stays empty.
                seat.window = Window(sinks=request.sinks, journal=Journal(1))
        except BaseException:
            if seat.lora_fd is not None:
                os.close(seat.lora_fd)
            raise
        seat.engine = engine
        with self._lock:
            self.seats[session] = seat
        return {"n_ctx": engine.n_ctx}

    def prefix(self, request: protocol.Prefix) -> dict[str, Any]:
        engine = self._engine(request.session)
        with engine.lock:
            self._still(request.session, engine)
            tokens = engine.tokenize(request.text, add_bos=request.add_bos)
            try:
                engine.check_fits(len(tokens))
                plan = sessions_mod.plan_prefix(engine.resident(), request.current_digest,
                                                tokens, request.digest)
                engine.prefill(plan.reused, plan.prefill, self.pace)
            except Overflow as error:
                raise WorkerError(Kind.OVERFLOW, tokens=error.tokens, n_ctx=error.n_ctx) from None
            return {"reused": plan.reused, "prefilled": len(plan.prefill),
                    "dropped": plan.dropped, "prefix_tokens": len(tokens),
                    "token_hash": sessions_mod.token_hash(tokens),
                    "resident": len(engine.resident())}

    def suffix(self, request: protocol.Suffix) -> dict[str, Any]:
        engine = self._engine(request.session)
        with engine.lock:
            self._still(request.session, engine)
            tokens = engine.tokenize(request.text, add_bos=False)
            try:
                engine.prefill(request.prefix_tokens, tokens, self.pace)
            except Overflow as error:
                raise WorkerError(Kind.OVERFLOW, tokens=error.tokens, n_ctx=error.n_ctx) from None
            return {"count": len(tokens), "resident": len(engine.resident())}

    def decode(self, request: protocol.Decode, sink: Sink) -> dict[str, Any]:
        """Generate from a session's resident state; with sinks, sliding
        past the window."""
        session = request.session
        seat = self._seat(session)
        engine = self._engine(session)
        params, compiled, speculative = (request.decoding.params, request.decoding.constraint,
                                         request.decoding.speculative)
        window = seat.window
        counts = Counts(_reasoning(engine, params))
        with contextlib.ExitStack() as held:
            drafter = None if speculative is None else \
                self._drafter(speculative, engine, seat.options, held)
            try:
                with engine.lock:
                    self._still(session, engine)
                    if speculative is not None:
                        if window is not None and len(engine.continuation()) >= engine.n_ctx:
                            engine.shift(window, 2)  # room to go on; drafts fit the rest
                        reason, counts.drafted, counts.accepted = engine.speculate(
                            engine.continuation(), params, sink.stop, sink.emit,
                            drafter=drafter, draft_max=speculative.draft_max or DRAFT_MAX,
                            pace=self.pace, first=sink.first)
                    else:
                        reason = engine.generate(
                            engine.continuation(), params, sink.stop, sink.emit,
                            pace=self.pace, first=sink.first,
                            logits_processor=_processor(engine, compiled),
                            reasoning=counts.reasoning, think=sink.think, window=window)
            except Overflow as error:
                raise WorkerError(Kind.OVERFLOW, tokens=error.tokens, n_ctx=error.n_ctx) from None
            finally:
                if window is not None:
                    counts.shifted = window.take_shifted()
        return {"reason": reason, "resident": len(engine.resident()), **counts.extra()}

    def save(self, request: protocol.Save) -> tuple[dict[str, Any], list[int]]:
        """Spill: the session's state into a memfd (handed to runtimed), its
        context closed."""
        seat = self._seat(request.session)
        engine = self._engine(request.session)
        with engine.lock:
            self._still(request.session, engine)
            saved = engine.save()
            fd = memfd_of(saved, "syntrop-spill")
            seat.engine = None
            engine.close()
        return {"tokens": len(saved.tokens), "bytes": len(saved.data)}, [fd]

    def restore(self, request: protocol.Restore, fds: list[int]) -> dict[str, Any]:
        """A spilled session back in a new context from the state behind
        fds[0]; `cold` when that state is lost or does not fit."""
        seat = self._seat(request.session)
        try:
            if seat.engine is not None:  # runtimed restores a spilled seat only
                raise WorkerError(Kind.INVALID_PARAMETER, parameter="session")
            engine = self._new_context(seat, request.lora or "")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        cold = False
        try:
            if not fds:
                raise ValueError("no saved state")
            engine.restore(read_saved(fds[0]))
        except (EngineError, OSError, ValueError) as error:
            # The state is lost (a spill file removed or damaged): the
            # session goes on cold, and runtimed says so (NoPrefix).
            logger.warning("session %s restored cold: %s", sessions_mod.tag(request.session), error)
            engine.prefill(0, [])
            cold = True
        except BaseException:
            engine.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        seat.engine = engine
        return {"cold": cold, "resident": len(engine.resident())}

    def close_session(self, request: protocol.Close) -> dict[str, Any]:
        session = request.session
        with self._lock:
            seat = self.seats.pop(session, None)
        if seat is None:
            return {}
        if seat.engine is not None:
            with seat.engine.lock:
                seat.engine.close()
        if seat.lora_fd is not None:
            os.close(seat.lora_fd)
        return {}
