"""The Varlink face of runtimed: io.syntrop.Runtime1.

Each method validates, calls the domain (models, engine, sessions, slots)
and maps domain exceptions to the declared errors. Inference never runs on
the event loop: blocking engine work goes to worker threads.

Streams (Complete, Chat, Decode): a worker thread generates and hands each
piece to the event loop through an asyncio queue; every reply is sent at
once (`AnnotatedResult(continues=True)`), the last one carries the finish
reason. When the client goes away the server cancels the generator; its
`finally` sets the stop event and the engine stops within one token. The
slot and the engine go back when the thread ends, not before.

Weights: a model is made resident from the descriptor modeld's OpenModel
hands over, hashed and compared with the digest modeld reports before
llama.cpp sees it, and loaded through /proc/self/fd/N. The descriptor stays
open while the model is resident; a model nothing holds is unloaded after
its keep-alive.

Spill: a session holds a slot (its context) while it is open. When a request
needs a slot and none is free, the least recently used idle session is
spilled (its sequence state copied to host memory, or to a file beyond the
byte budget) and its context closed; the next call on it takes a slot again
and restores the state, so its prefix is reused as before.

Tracing (for the benchmark): with SYNTROP_RUNTIMED_TRACE set to a file,
each stream appends one JSON line of CLOCK_MONOTONIC times: when the call
arrived, when the engine started on it (in its worker thread), when it
sampled its first token, when the first reply went out.
"""

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from asyncvarlink import AnnotatedResult, VarlinkErrorReply

from syntrop.config import Paths
from syntrop.interfaces import model as model_contract
from syntrop.interfaces.model import Model1
from syntrop.interfaces.runtime import (
    AdapterMismatch,
    Busy,
    ChatMessage,
    Chunk,
    Constraint,
    ContextManifest,
    ContextOverflow,
    ContextReport,
    Embedding,
    EmbedResult,
    InvalidConstraint,
    InvalidModel,
    InvalidSampling,
    LoadedModel,
    LoadResult,
    ModelNotFound,
    NoPrefix,
    OpenSessionResult,
    PrefixStatus,
    Runtime1,
    Sampling,
    SessionConfig,
    SessionNotFound,
    ShiftUnsupported,
    Speculative,
    StaleOwner,
    SuffixStatus,
    UnloadResult,
    VocabularyMismatch,
    WeightsMismatch,
)
from syntrop.runtimed import sessions as sessions_mod
from syntrop.runtimed.config import Config, load
from syntrop.runtimed.engine import (
    KV_TYPES,
    Emit,
    Engine,
    EngineError,
    LoadError,
    Options,
    Output,
    Overflow,
    Think,
)
from syntrop.runtimed.layout import Pace
from syntrop.runtimed.models import Resident, WeightsDiffer, open_in_modeld
from syntrop.runtimed.sampling import Params, SamplingError, validate
from syntrop.runtimed.sessions import (
    SessionTable,
    StaleSession,
    UnknownSession,
)
from syntrop.runtimed.slots import Slots, SlotsBusy
from syntrop.runtimed.spill import SpillStore
from syntrop.varlink import InvalidParameter, implements

if TYPE_CHECKING:
    # Imported when a request is constrained (llguidance, jsonschema behind it).
    from syntrop.runtimed import constrain
    from syntrop.runtimed.batch import Batcher
    from syntrop.runtimed.reasoning import Reasoning
    from syntrop.runtimed.sinks import Window

logger = logging.getLogger(__name__)

MAX_NAME = 256
MAX_TEXT = 1 << 20
MAX_MESSAGES = 256
MAX_INPUTS = 256
ROLES = ("system", "user", "assistant")
MODELD_TIMEOUT = 30.0
#: Most tokens one Decode of a session with sinks may generate.
MAX_STREAM_TOKENS = 1 << 20
#: Journal size of a session with sinks: default and most.
JOURNAL_BYTES = 16384
MAX_JOURNAL_BYTES = 1 << 20
#: Most tokens drafted per speculative step: default and most.
DRAFT_MAX = 8
MAX_DRAFT_MAX = 16

Item = Chunk | BaseException
#: Extra fields of a stream's last chunk, read when its work has ended.
Final = Callable[[], dict[str, Any]]


@dataclass(eq=False, slots=True, kw_only=True)
class Seat:
    """Where a session's context is: an engine holding a slot, or spilled
    (`engine` None, its state in the spill store)."""

    options: Options
    engine: Engine | None
    n_ctx: int
    #: Calls using the seat now (a spill waits for none).
    busy: int = 0
    used: float = field(default_factory=time.monotonic)
    #: Resident tokens while spilled.
    spilled_tokens: int = 0
    #: The session's LoRA adapter (modeld's descriptor) and its scale.
    lora_fd: int | None = None
    lora_scale: float = 1.0
    #: With sinks: the sliding window (and the journal of the stream).
    window: "Window | None" = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(eq=False, slots=True)
class Work:
    """A stream's work for its worker thread (`run`), and what its last
    chunk reports once it has run (`final`)."""

    reasoning: "Reasoning | None" = None
    run: Callable[[threading.Event, Emit, Callable[[], None], Think], str] = \
        field(default=lambda *_: "stop")
    drafted: int | None = None
    accepted: int | None = None
    shifted: int | None = None

    def final(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"drafted_tokens": self.drafted,
                                 "accepted_tokens": self.accepted,
                                 "shifted_tokens": self.shifted}
        if self.reasoning is not None:
            extra.update(thinking_tokens=self.reasoning.thinking_tokens,
                         answer_tokens=self.reasoning.answer_tokens)
        return extra


class RuntimeService(Runtime1):
    """Runs GGUF models with persistent sessions."""

    def __init__(self, paths: Paths, config: Config | None = None) -> None:
        self.paths = paths
        self.config = config or load(paths.configuration)
        self.slots = Slots(self.config.slots, self.config.queue)
        self.pace = Pace(self.config.layout, self.config.n_threads, self.config.instances)
        self.models: dict[str, Resident] = {}
        self.table: SessionTable[Seat] = SessionTable()
        self.spill = SpillStore(paths.state / "spill", self.config.spill_ram)
        self._loading = asyncio.Lock()
        self._workers: set[asyncio.Future[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._trace = os.environ.get("SYNTROP_RUNTIMED_TRACE")

    # models ---------------------------------------------------------------------

    async def _resident(self, name: str) -> Resident:
        """The model, made resident from modeld's descriptor if it is not."""
        if not name or len(name) > MAX_NAME or "\0" in name:
            raise InvalidParameter(parameter="model")
        async with self._loading:
            if name in self.models:
                self.models[name].hold()
                return self.models[name]
            fd, digest, size = await self._open_in_modeld(name)
            try:
                resident = await asyncio.to_thread(Resident.open, name, fd, digest, size)
            except WeightsDiffer as error:
                raise WeightsMismatch(expected=error.expected, actual=error.actual) from None
            except LoadError as error:
                raise InvalidModel(model=name, reason=error.reason) from None
            resident.hold()
            self.models[name] = resident
            logger.info("loaded %s (sha256 %s)", name, resident.digest)
            if self._sweeper is None or self._sweeper.done():
                self._sweeper = asyncio.create_task(self._keep_alive())
            return resident

    async def _open_in_modeld(self, name: str) -> tuple[int, str, int]:
        """modeld's descriptor, digest and size of `name`; ModelNotFound when
        modeld has no such model or cannot be reached."""
        try:
            return await open_in_modeld(self.paths.socket(Model1.name), name, MODELD_TIMEOUT)
        except (model_contract.ModelNotFound, model_contract.InvalidIdentifier):
            raise ModelNotFound(model=name) from None
        except OSError as error:
            logger.warning("cannot reach modeld: %s", error)
            raise ModelNotFound(model=name) from None

    async def _adapter(self, name: str) -> int:
        """A LoRA adapter's descriptor from modeld, its bytes checked against
        the digest modeld reports (llama.cpp sees it only after `attach`'s
        check against the model)."""
        if not name or len(name) > MAX_NAME or "\0" in name:
            raise InvalidParameter(parameter="config.lora")
        fd, digest, _ = await self._open_in_modeld(name)
        from syntrop.runtimed.engine import verify

        actual = await asyncio.to_thread(verify, fd)
        if actual != digest:
            os.close(fd)
            raise WeightsMismatch(expected=digest, actual=actual)
        return fd

    def _keep_alive_left(self, name: str, resident: Resident, now: float) -> float | None:
        """Seconds before `name` is unloaded; None while it is in use."""
        idle = resident.idle_for(now)
        if idle is None or any(s.model == name for s in self.table):
            return None
        return max(0.0, self.config.keep_alive - idle)

    async def _keep_alive(self) -> None:
        """Unload models idle past the keep-alive, or idle at all while memory
        is under pressure, until none is resident."""
        period = max(0.05, min(self.config.keep_alive / 4, 5.0))
        while self.models:
            await asyncio.sleep(period)
            pressed = self._memory_pressed()
            async with self._loading:
                now = time.monotonic()
                lefts = {name: self._keep_alive_left(name, resident, now)
                         for name, resident in self.models.items()}
                expired = [name for name, left in lefts.items()
                           if left == 0.0 or (pressed and left is not None)]
                await self._unload(expired, "under memory pressure" if pressed
                                   else "idle for its keep-alive")
            if pressed:
                try:
                    await self._shed()
                except (EngineError, OSError) as error:
                    logger.warning("shedding under memory pressure failed: %s", error)

    async def _shed(self) -> None:
        """Under memory pressure, beyond unloading idle models: close the
        contexts kept for later requests, spill every idle session (its
        context freed) and move spilled state from memory to files."""
        closed = sum([await asyncio.to_thread(m.trim) for m in list(self.models.values())])
        spilled = 0
        while await self._spill_one(None):
            spilled += 1
        moved = await asyncio.to_thread(self.spill.flush)
        if closed or spilled or moved:
            logger.info("memory pressure: closed %d idle contexts, spilled %d sessions, "
                        "moved %d bytes of session state to disk", closed, spilled, moved)

    def _memory_pressed(self) -> bool:
        """Whether memory PSI (some, avg10) is over `unload_pressure`."""
        if not self.config.unload_pressure:
            return False
        from syntrop.system import psi

        try:
            with open(self.config.pressure_file) as source:
                stalled = psi.parse(source.read()).some.avg10
        except (OSError, psi.PsiFormatError):
            return False
        return stalled > self.config.unload_pressure

    async def _unload(self, names: list[str], why: str) -> int:
        """Close `names` (resident, idle: the caller checked under
        `_loading`); bytes freed."""
        freed = 0
        for name in names:
            # Closed before it leaves GetLoad: once it is gone there, modeld
            # no longer counts it in use.
            resident = self.models[name]
            await asyncio.to_thread(resident.close)
            del self.models[name]
            freed += resident.size
            logger.info("unloaded %s: %s", name, why)
        return freed

    @implements
    async def Unload(self, *, model: str | None = None) -> UnloadResult:
        if model is not None and (not model or len(model) > MAX_NAME or "\0" in model):
            raise InvalidParameter(parameter="model")
        async with self._loading:
            now = time.monotonic()
            names = [n for n in self.models if model is None or n == model]
            idle = [n for n in names
                    if self._keep_alive_left(n, self.models[n], now) is not None]
            freed = await self._unload(idle, "asked to")
        return {"unloaded": idle, "in_use": [n for n in names if n not in idle],
                "freed_bytes": freed}

    def _options(self, config: SessionConfig | None = None, *, embedding: bool = False) -> Options:
        c = config or SessionConfig(n_ctx=None, n_batch=None, n_threads=None, n_gpu_layers=None,
                                    flash_attn=None, kv_cache_type=None, prompt_format=None,
                                    disable_bos=None)
        checks = (("n_ctx", c.n_ctx, 16, 1 << 17), ("n_batch", c.n_batch, 1, 1 << 14),
                  ("n_threads", c.n_threads, 0, 1024), ("n_gpu_layers", c.n_gpu_layers, 0, 1024))
        for parameter, value, low, high in checks:
            if value is not None and not low <= value <= high:
                raise InvalidParameter(parameter=f"config.{parameter}")
        kv_cache_type = c.kv_cache_type or "f16"
        if kv_cache_type not in KV_TYPES:
            raise InvalidParameter(parameter="config.kv_cache_type")
        if kv_cache_type != "f16" and c.flash_attn is False:
            # llama.cpp quantises the V cache only with flash attention.
            raise InvalidParameter(parameter="config.flash_attn")
        return Options(
            n_ctx=c.n_ctx or self.config.n_ctx,
            n_batch=c.n_batch or 512,
            n_threads=c.n_threads if c.n_threads is not None else self.config.n_threads,
            n_gpu_layers=c.n_gpu_layers or 0,
            flash_attn=bool(c.flash_attn),
            embedding=embedding,
            kv_cache_type=kv_cache_type,
        )

    async def _slot(self, keep: Seat | None = None) -> None:
        """Take a slot; when none is free, spill the least recently used idle
        session (never `keep`) rather than wait."""
        if self.slots.free == 0 and not self.slots.queue_depth:
            await self._spill_one(keep)
        try:
            await self.slots.acquire()
        except SlotsBusy as error:
            raise Busy(queue_depth=error.queue_depth) from None

    # spill ----------------------------------------------------------------------

    async def _spill_one(self, keep: Seat | None) -> bool:
        """Spill the least recently used idle session; whether one was."""
        idle = [s for s in self.table if s.engine.engine is not None and not s.engine.busy
                and not s.engine.lock.locked() and s.engine is not keep]
        if not idle:
            return False
        session = min(idle, key=lambda s: s.engine.used)
        seat = session.engine
        async with seat.lock:
            engine = seat.engine
            if engine is None:  # spilled by another caller meanwhile
                return True
            try:
                saved = await asyncio.to_thread(engine.save)
                await asyncio.to_thread(self.spill.put, session.session_id, saved)
            except (EngineError, OSError) as error:
                logger.warning("cannot spill session %s: %s", session.session_id, error)
                return False
            seat.engine, seat.spilled_tokens = None, len(saved.tokens)
            await asyncio.to_thread(engine.close)
            self.slots.release()
        where = "a file" if self.spill.on_disk(session.session_id) else "memory"
        logger.info("spilled session %s (%d tokens, %d bytes) to %s", session.session_id,
                    len(saved.tokens), len(saved.data), where)
        return True

    async def _wake(self, session: sessions_mod.Session[Seat]) -> Engine:
        """The session's engine, restored from the spill store if it was
        spilled; the seat counts as busy until `_rest`."""
        seat = session.engine
        seat.busy += 1
        try:
            async with seat.lock:
                if seat.engine is None:
                    seat.engine = await self._restore(session)
                return seat.engine
        except BaseException:
            self._rest(session)
            raise

    def _rest(self, session: sessions_mod.Session[Seat]) -> None:
        session.engine.busy -= 1
        session.engine.used = time.monotonic()

    async def _restore(self, session: sessions_mod.Session[Seat]) -> Engine:
        seat = session.engine
        await self._slot(keep=seat)
        try:
            resident = self.models[session.model]
            engine = await asyncio.to_thread(Engine.load, resident.fd, seat.options)
        except BaseException:
            self.slots.release()
            raise
        try:
            if seat.lora_fd is not None:
                await asyncio.to_thread(engine.attach_lora, seat.lora_fd, seat.lora_scale)
            saved = await asyncio.to_thread(self.spill.take, session.session_id)
            await asyncio.to_thread(engine.restore, saved)
        except (EngineError, OSError, KeyError, ValueError) as error:
            # The state is lost (a spill file removed or damaged): the
            # session goes on cold, and says so (NoPrefix until EnsurePrefix).
            logger.warning("session %s restored cold: %s", session.session_id, error)
            await asyncio.to_thread(engine.prefill, 0, [])
            session.manifest = session.manifest_digest = None
            session.prefix_tokens = 0
            return engine
        except BaseException:
            await asyncio.to_thread(engine.close)
            self.slots.release()
            raise
        logger.info("restored session %s (%d tokens)", session.session_id, len(saved.tokens))
        return engine

    # streams --------------------------------------------------------------------

    def _params(self, sampling: Sampling | None, n_ctx: int) -> Params:
        s = sampling or Sampling(max_tokens=None, temperature=None, top_p=None, top_k=None,
                                 seed=None, stop=None)
        try:
            return validate(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                            top_k=s.top_k, seed=s.seed, stop=s.stop, min_p=s.min_p,
                            reasoning_budget=s.reasoning_budget, n_ctx=n_ctx)
        except SamplingError as error:
            raise InvalidSampling(parameter=error.parameter, reason=error.reason) from None

    async def _constraint(self, constraint: Constraint | None,
                          ) -> "constrain.Constraint | None":
        """Compile a request's constraint (llguidance, jsonschema: imported on
        the first constrained request), or answer InvalidConstraint."""
        if constraint is None:
            return None
        from syntrop.runtimed import constrain

        kinds = [k for k, v in (("json_schema", constraint.json_schema),
                                ("regex", constraint.regex),
                                ("varlink", constraint.interface or constraint.method))
                 if v is not None]
        if len(kinds) != 1:
            raise InvalidConstraint(reason="ambiguous", message="set exactly one of json_schema, "
                                    "regex, or interface with method")
        try:
            if constraint.json_schema is not None:
                return await asyncio.to_thread(constrain.from_json_schema, constraint.json_schema)
            if constraint.regex is not None:
                return await asyncio.to_thread(constrain.from_regex, constraint.regex)
            if not constraint.interface or not constraint.method:
                raise constrain.ConstraintError("ambiguous", "interface and method go together")
            return await asyncio.to_thread(constrain.from_varlink, constraint.interface,
                                           constraint.method)
        except constrain.ConstraintError as error:
            raise InvalidConstraint(reason=error.reason, message=error.message[:512]) from None

    @staticmethod
    def _bounded(params: Params, compiled: "constrain.Constraint | None", n_ctx: int) -> Params:
        """A constrained stream decodes at least its constraint's bound (and
        the end token), so max_tokens never cuts a value short."""
        if compiled is None or compiled.max_tokens is None:
            return params
        return replace(params, max_tokens=min(n_ctx, max(params.max_tokens,
                                                         compiled.max_tokens + 1)))

    @staticmethod
    def _processor(engine: Engine, compiled: "constrain.Constraint | None") -> Any:
        return None if compiled is None else engine.guide(compiled)

    @staticmethod
    def _thinking(params: Params, compiled: "constrain.Constraint | None") -> None:
        if params.reasoning_budget is not None and compiled is not None:
            raise InvalidConstraint(reason="unsupported", message="a constraint cannot follow "
                                    "thinking yet: send constraint or reasoning_budget")

    @staticmethod
    def _reasoning(engine: Engine, params: Params) -> "Reasoning | None":
        """The request's thinking budget on `engine`, or InvalidSampling for a
        model without single-token thinking markers."""
        if params.reasoning_budget is None:
            return None
        from syntrop.runtimed.reasoning import ReasoningError

        try:
            return engine.reasoning(params.reasoning_budget)
        except ReasoningError as error:
            raise InvalidSampling(parameter="reasoning_budget", reason=error.reason) from None

    async def _stream(
        self, work: Callable[[threading.Event, Emit, Callable[[], None], Think], str],
        done: Callable[[], None], received: float, final: Final | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        """Run `work` in a thread and stream its pieces; `done` runs on the
        loop once the thread has ended, whatever happened to the client.
        `work` calls its third argument when it samples its first token and
        its fourth with thinking text; `final` gives the last chunk's extra
        fields (counts), once `work` has returned."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Item] = asyncio.Queue()
        stop = threading.Event()
        times = {"received": received}

        def first() -> None:
            times["first_token"] = time.monotonic()

        def put(item: Item) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def emit(text: str, tokens: int) -> None:
            put(Chunk(text=text, tokens=tokens, finish_reason=None))

        def think(text: str, tokens: int) -> None:
            put(Chunk(text=text, tokens=tokens, finish_reason=None, thinking=True))

        def run() -> None:
            times["engine_start"] = time.monotonic()
            try:
                reason = work(stop, emit, first, think)
                extra = final() if final is not None else {}
            except BaseException as error:  # handed to the loop, raised there
                put(error)
            else:
                put(Chunk(text="", tokens=0, finish_reason=reason, **extra))

        future = loop.run_in_executor(None, run)
        self._workers.add(future)

        def finished(f: asyncio.Future[None]) -> None:
            self._workers.discard(f)
            done()

        future.add_done_callback(finished)
        try:
            held: Item | None = None
            while True:
                item = held if held is not None else await queue.get()
                held = None
                # Answer pieces that queued up while the last reply went out
                # leave as one reply: a loop that falls behind the engine
                # catches up. (Thinking pieces stay apart: a marker's empty
                # piece carries its token count on its own.)
                while isinstance(item, Chunk) and item.finish_reason is None \
                        and not item.thinking and not queue.empty():
                    following = queue.get_nowait()
                    if isinstance(following, Chunk) and following.finish_reason is None \
                            and not following.thinking:
                        item = replace(item, text=item.text + following.text,
                                       tokens=item.tokens + following.tokens)
                    else:
                        held = following
                        break
                if isinstance(item, Overflow):
                    raise ContextOverflow(tokens=item.tokens, n_ctx=item.n_ctx)
                if isinstance(item, Exception) and hasattr(item, "reason"):
                    from syntrop.runtimed.constrain import ConstraintError

                    if isinstance(item, ConstraintError):
                        raise InvalidConstraint(reason=item.reason, message=item.message[:512])
                if isinstance(item, VarlinkErrorReply):
                    raise item
                if isinstance(item, BaseException):
                    logger.error("generation failed", exc_info=item)
                    raise RuntimeError("generation failed")
                last = item.finish_reason is not None
                if last:
                    # The worker ends right after its last chunk: let it (and
                    # `done` free the slot) before the last reply goes out,
                    # so the client's next call finds the slot free.
                    await asyncio.shield(future)
                yield AnnotatedResult({"chunk": item}, continues=not last)
                times.setdefault("first_sent", time.monotonic())
                if last:
                    return
        finally:
            stop.set()
            if self._trace:
                with contextlib.suppress(OSError), open(self._trace, "a") as trace:
                    trace.write(json.dumps(times) + "\n")

    async def _generate(self, model: str, sampling: Sampling | None,
                        prompt: Callable[[Engine], tuple[list[int], tuple[str, ...]]],
                        constraint: Constraint | None = None,
                        ) -> AsyncIterator[AnnotatedResult]:
        received = time.monotonic()
        options = self._options()
        compiled = await self._constraint(constraint)
        params = self._bounded(self._params(sampling, options.n_ctx), compiled, options.n_ctx)
        self._thinking(params, compiled)
        speculative = self._speculative(sampling, params, compiled)
        # What the request holds, given back (in reverse) when its work ends.
        held = contextlib.ExitStack()
        try:
            resident = await self._resident(model)
            held.callback(resident.release)
            await self._slot()
            held.callback(self.slots.release)
            if self.config.layout == "batch" and speculative is None:
                batcher, engine = await self._batcher(resident, options)
                reasoning = self._reasoning(engine, params)
                work = self._batched(batcher, engine, prompt, params, compiled, reasoning)
            else:
                engine = await self._take(resident, options)
                held.callback(resident.give, options, engine)
                reasoning = self._reasoning(engine, params)
                drafter = None if speculative is None else \
                    await self._drafter(speculative, resident, engine, options, held)
                work = self._solo(engine, prompt, params, compiled, reasoning, drafter,
                                  speculative)
        except BaseException:
            held.close()
            raise
        async for reply in self._stream(work.run, held.close, received, work.final):
            yield reply

    @staticmethod
    async def _take(resident: Resident, options: Options) -> Engine:
        """An idle context of `resident`, at once, or a new one (loading blocks)."""
        engine = resident.take_idle(options)
        return engine if engine is not None else await asyncio.to_thread(resident.take, options)

    def _solo(self, engine: Engine,
              prompt: Callable[[Engine], tuple[list[int], tuple[str, ...]]], params: Params,
              compiled: "constrain.Constraint | None", reasoning: "Reasoning | None",
              drafter: Any, speculative: Speculative | None) -> "Work":
        """A stream on a context of its own (plain or speculative)."""
        work = Work(reasoning)

        def run(stop: threading.Event, emit: Emit, first: Callable[[], None],
                think: Think) -> str:
            tokens, stops = prompt(engine)
            if not tokens:
                raise InvalidParameter(parameter="prompt")
            if speculative is not None:
                reason, work.drafted, work.accepted = engine.speculate(
                    tokens, params, stop, emit, drafter=drafter,
                    draft_max=speculative.draft_max or DRAFT_MAX, extra_stops=stops,
                    pace=self.pace, first=first)
                return reason
            return engine.generate(tokens, params, stop, emit, extra_stops=stops,
                                   pace=self.pace, first=first,
                                   logits_processor=self._processor(engine, compiled),
                                   reasoning=reasoning, think=think)

        work.run = run
        return work

    def _batched(self, batcher: "Batcher", engine: Engine,
                 prompt: Callable[[Engine], tuple[list[int], tuple[str, ...]]], params: Params,
                 compiled: "constrain.Constraint | None",
                 reasoning: "Reasoning | None") -> "Work":
        """A stream as one sequence of the model's shared batch (layout
        batch): its worker thread submits it and waits, relaying a cancel."""
        work = Work(reasoning)

        def run(stop: threading.Event, emit: Emit, first: Callable[[], None],
                think: Think) -> str:
            tokens, stops = prompt(engine)
            if not tokens:
                raise InvalidParameter(parameter="prompt")
            if len(tokens) >= batcher.n_ctx_seq:
                raise Overflow(len(tokens), batcher.n_ctx_seq)
            output = Output(engine.llama, emit, params.stop + stops, reasoning, think)
            processors = [*(self._processor(engine, compiled) or ()),
                          *([reasoning] if reasoning is not None else [])]

            def on_token(token: int) -> bool:
                if output.count == 0:
                    first()
                return output.token(token)

            request = batcher.submit(
                tokens, min(params.max_tokens, batcher.n_ctx_seq - len(tokens)),
                temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                min_p=params.min_p, seed=params.seed, processors=processors,
                on_token=on_token)
            while not request.wait(0.05):
                if stop.is_set():
                    request.cancel()
            if request.error is not None:
                raise request.error
            output.close()
            return str(request.reason)

        work.run = run
        return work

    async def _batcher(self, resident: Resident, options: Options) -> tuple["Batcher", Engine]:
        """The model's shared decode batch, made on first use: `slots`
        sequences of the configured window, and a small context of the same
        model that tokenizes for it."""
        async with self._loading:
            if resident.batcher is not None and not resident.batcher.alive:
                logger.error("the shared batch of %s stopped; making a new one", resident.name)
                await asyncio.to_thread(resident.batcher.close)
                resident.batcher = None
            if resident.batcher is None:
                from syntrop.runtimed.batch import Batcher, DecodeError

                def make() -> tuple[Batcher, Engine]:
                    engine = Engine.load(resident.fd, Options(n_ctx=64, n_batch=64,
                                                              n_threads=1))
                    try:
                        batcher = Batcher(engine.llama, n_seq=self.config.slots,
                                          n_ctx_seq=options.n_ctx,
                                          n_batch=max(options.n_batch, self.config.slots),
                                          threads=self.config.n_threads)
                    except BaseException:
                        engine.close()
                        raise
                    batcher.start()
                    return batcher, engine

                if resident.batch_engine is not None:
                    await asyncio.to_thread(resident.batch_engine.close)
                    resident.batch_engine = None
                try:
                    resident.batcher, resident.batch_engine = await asyncio.to_thread(make)
                except (LoadError, DecodeError, ValueError) as error:
                    raise InvalidModel(model=resident.name, reason="cannot make its shared "
                                       f"batch ({self.config.slots} x {options.n_ctx} "
                                       f"tokens): {error}") from None
        assert resident.batch_engine is not None
        return resident.batcher, resident.batch_engine

    def _speculative(self, sampling: Sampling | None, params: Params,
                     compiled: "constrain.Constraint | None") -> Speculative | None:
        """The request's speculative decoding, checked."""
        spec = sampling.speculative if sampling is not None else None
        if spec is None:
            return None
        if spec.draft_max is not None and not 1 <= spec.draft_max <= MAX_DRAFT_MAX:
            raise InvalidSampling(parameter="speculative.draft_max",
                                  reason=f"1 to {MAX_DRAFT_MAX}")
        if spec.draft is not None and (not spec.draft or len(spec.draft) > MAX_NAME
                                       or "\0" in spec.draft):
            raise InvalidParameter(parameter="sampling.speculative.draft")
        if compiled is not None:
            raise InvalidConstraint(reason="unsupported", message="a constraint cannot "
                                    "follow speculative decoding yet: send one of them")
        if params.reasoning_budget is not None:
            raise InvalidSampling(parameter="speculative",
                                  reason="not with a reasoning budget")
        return spec

    async def _drafter(self, spec: Speculative, target: Resident, engine: Engine,
                       options: Options, held: contextlib.ExitStack) -> Any:
        """Prompt lookup, or a draft model's context (held until the stream
        ends) whose vocabulary was checked against the target's."""
        from syntrop.runtimed import speculative as sp

        if spec.draft is None:
            return sp.PromptLookup()
        draft = await self._resident(spec.draft)
        held.callback(draft.release)
        try:
            draft_engine = await self._take(draft, options)
        except LoadError as error:
            raise InvalidModel(model=spec.draft, reason=error.reason) from None
        held.callback(draft.give, options, draft_engine)

        def check() -> Any:
            for resident, llama in ((target, engine.llama), (draft, draft_engine.llama)):
                if resident.vocabulary is None:
                    resident.vocabulary = sp.vocabulary_digest(llama)
            sp.check_vocabulary(engine.llama, draft_engine.llama,
                                digests=(target.vocabulary, draft.vocabulary))
            return sp.DraftModel(engine.llama, draft_engine.llama, checked=True)

        try:
            drafter = await asyncio.to_thread(check)
        except sp.VocabularyMismatch as error:
            raise VocabularyMismatch(draft=spec.draft, reason=error.reason) from None
        held.callback(drafter.close)  # before its context goes back to the pool
        return drafter

    @implements
    async def Complete(
        self, *, model: str, prompt: str, sampling: Sampling | None = None,
        constraint: Constraint | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        if len(prompt) > MAX_TEXT:
            raise InvalidParameter(parameter="prompt")
        async for reply in self._generate(
            model, sampling, lambda engine: (engine.tokenize(prompt, add_bos=True), ()),
            constraint,
        ):
            yield reply

    @implements
    async def Chat(
        self, *, model: str, messages: list[ChatMessage], sampling: Sampling | None = None,
        constraint: Constraint | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        if not messages or len(messages) > MAX_MESSAGES:
            raise InvalidParameter(parameter="messages")
        if any(m.role not in ROLES or len(m.content) > MAX_TEXT for m in messages):
            raise InvalidParameter(parameter="messages")
        turns = [(m.role, m.content) for m in messages]
        async for reply in self._generate(model, sampling,
                                          lambda engine: engine.chat_prompt(turns), constraint):
            yield reply

    @implements
    async def Embed(self, *, model: str, input: list[str]) -> EmbedResult:
        if not input or len(input) > MAX_INPUTS or any(len(t) > MAX_TEXT for t in input):
            raise InvalidParameter(parameter="input")
        options = self._options(embedding=True)
        resident = await self._resident(model)
        try:
            await self._slot()
            try:
                engine = await asyncio.to_thread(resident.take, options)
                try:
                    vectors = await asyncio.to_thread(engine.embed, input, self.pace)
                except Overflow as error:
                    raise ContextOverflow(tokens=error.tokens, n_ctx=error.n_ctx) from None
                finally:
                    resident.give(options, engine)
            finally:
                self.slots.release()
        finally:
            resident.release()
        return {"embeddings": [Embedding(vector=v) for v in vectors],
                "dimensions": len(vectors[0]) if vectors else 0}

    # sessions -------------------------------------------------------------------

    def _session(self, session_id: str) -> sessions_mod.Session[Seat]:
        try:
            return self.table.get(session_id)
        except UnknownSession:
            raise SessionNotFound(session_id=session_id) from None
        except StaleSession as error:
            raise StaleOwner(session_id=session_id, owner_instance_id=error.owner) from None

    async def _free(self, session: sessions_mod.Session[Seat]) -> None:
        """Close a removed session's context (after any generation on it) and
        free its slot, or drop its spilled state; release its model."""
        seat = session.engine
        async with seat.lock:
            engine, seat.engine = seat.engine, None
            if engine is None:
                await asyncio.to_thread(self.spill.drop, session.session_id)
            else:
                def work() -> None:
                    with engine.lock:
                        engine.close()

                try:
                    await asyncio.to_thread(work)
                finally:
                    self.slots.release()
            if seat.lora_fd is not None:
                os.close(seat.lora_fd)
                seat.lora_fd = None
        if session.model in self.models:
            self.models[session.model].release()

    @implements
    async def OpenSession(
        self, *, owner_instance_id: str, model: str, config: SessionConfig | None = None
    ) -> OpenSessionResult:
        if not owner_instance_id or len(owner_instance_id) > MAX_NAME:
            raise InvalidParameter(parameter="owner_instance_id")
        options = self._options(config)
        window = self._window(config, options.n_ctx)
        lora = config.lora if config else None
        scale = config.lora_scale if config and config.lora_scale is not None else 1.0
        if not 0.0 <= scale <= 4.0:
            raise InvalidParameter(parameter="config.lora_scale")
        lora_fd = await self._adapter(lora) if lora is not None else None
        try:
            resident = await self._resident(model)
        except BaseException:
            if lora_fd is not None:
                os.close(lora_fd)
            raise
        try:
            for ended in self.table.fence(owner_instance_id):
                logger.info("session %s ended by a takeover", ended.session_id)
                await self._free(ended)
            await self._slot()
            try:
                engine = await asyncio.to_thread(Engine.load, resident.fd, options)
            except BaseException:
                self.slots.release()
                raise
            if lora_fd is not None:
                await self._attach(engine, lora or "", lora_fd, scale)
            if window is not None and not engine.can_shift():
                await asyncio.to_thread(engine.close)
                self.slots.release()
                raise ShiftUnsupported(model=model)
        except LoadError as error:
            resident.release()
            raise InvalidModel(model=model, reason=error.reason) from None
        except BaseException:
            resident.release()
            if lora_fd is not None:
                os.close(lora_fd)
            raise
        seat = Seat(options=options, engine=engine, n_ctx=engine.n_ctx, lora_fd=lora_fd,
                    lora_scale=scale, window=window)
        session = self.table.add(owner=owner_instance_id, model=model, engine=seat,
                                 add_bos=not (config and config.disable_bos))
        return {"session_id": session.session_id, "owner_instance_id": owner_instance_id}

    @staticmethod
    def _window(config: SessionConfig | None, n_ctx: int) -> "Window | None":
        """A session's sliding window, when its configuration asks for sinks."""
        if config is None or config.sinks is None:
            if config is not None and config.journal_bytes is not None:
                raise InvalidParameter(parameter="config.journal_bytes")
            return None
        if not 0 <= config.sinks <= n_ctx // 2:
            raise InvalidParameter(parameter="config.sinks")
        size = JOURNAL_BYTES if config.journal_bytes is None else config.journal_bytes
        if not 1 <= size <= MAX_JOURNAL_BYTES:
            raise InvalidParameter(parameter="config.journal_bytes")
        from syntrop.runtimed.sinks import Journal, Window

        return Window(sinks=config.sinks, journal=Journal(size))

    async def _attach(self, engine: Engine, name: str, fd: int, scale: float) -> None:
        """Apply a session's adapter to its new context, or close the context,
        free the slot and answer AdapterMismatch."""
        from syntrop.runtimed.lora import AdapterError

        try:
            await asyncio.to_thread(engine.attach_lora, fd, scale)
        except AdapterError as error:
            await asyncio.to_thread(engine.close)
            self.slots.release()
            raise AdapterMismatch(adapter=name, reason=error.reason[:512]) from None

    @implements
    async def EnsurePrefix(
        self, *, session_id: str, text: str, manifest: ContextManifest
    ) -> PrefixStatus:
        session = self._session(session_id)
        if len(text) > MAX_TEXT:
            raise InvalidParameter(parameter="text")
        key = asdict(manifest)
        digest = sessions_mod.manifest_digest(key)
        engine = await self._wake(session)

        def work() -> sessions_mod.Plan:
            with engine.lock:
                tokens = engine.tokenize(text, add_bos=session.add_bos)
                engine.check_fits(len(tokens))
                plan = sessions_mod.plan_prefix(engine.resident(), session.manifest_digest,
                                                tokens, digest)
                engine.prefill(plan.reused, plan.prefill, self.pace)
                session.prefix_tokens = len(tokens)
                session.stable_token_hash = sessions_mod.token_hash(tokens)
                return plan

        try:
            plan = await asyncio.to_thread(work)
        except Overflow as error:
            raise ContextOverflow(tokens=error.tokens, n_ctx=error.n_ctx) from None
        finally:
            self._rest(session)
        session.manifest, session.manifest_digest = key, digest
        session.stable_byte_hash = sessions_mod.sha256_hex(text.encode())
        if session.engine.window is not None:
            session.engine.window.prefix_cut = False
        return {
            "reused_tokens": plan.reused,
            "prefilled_tokens": len(plan.prefill),
            "dropped_tokens": plan.dropped,
            "prefix_tokens": session.prefix_tokens,
            "resident_tokens": session.prefix_tokens,
            "available_tokens": engine.n_ctx - session.prefix_tokens,
            "stable_byte_hash": session.stable_byte_hash,
            "stable_token_hash": session.stable_token_hash,
            "manifest_digest": digest,
        }

    @implements
    async def PrefillSuffix(
        self, *, session_id: str, text: str, manifest: ContextManifest
    ) -> SuffixStatus:
        session = self._session(session_id)
        window = session.engine.window
        if session.manifest_digest is None or (window is not None and window.prefix_cut):
            # No prefix yet, or a shift dropped part of it: EnsurePrefix first.
            raise NoPrefix(session_id=session_id)
        if sessions_mod.manifest_digest(asdict(manifest)) != session.manifest_digest:
            raise InvalidParameter(parameter="manifest")
        if len(text) > MAX_TEXT:
            raise InvalidParameter(parameter="text")
        engine = await self._wake(session)
        if session.manifest_digest is None:  # restored cold
            self._rest(session)
            raise NoPrefix(session_id=session_id)

        def work() -> int:
            with engine.lock:
                tokens = engine.tokenize(text, add_bos=False)
                engine.prefill(session.prefix_tokens, tokens, self.pace)
                return len(tokens)

        try:
            count = await asyncio.to_thread(work)
        except Overflow as error:
            raise ContextOverflow(tokens=error.tokens, n_ctx=error.n_ctx) from None
        finally:
            self._rest(session)
        resident = session.prefix_tokens + count
        return {
            "suffix_tokens": count,
            "prefix_tokens": session.prefix_tokens,
            "resident_tokens": resident,
            "available_tokens": engine.n_ctx - resident,
            "manifest_digest": session.manifest_digest,
        }

    @implements
    async def Decode(
        self, *, session_id: str, sampling: Sampling | None = None,
        constraint: Constraint | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        received = time.monotonic()
        session = self._session(session_id)
        if session.manifest_digest is None:
            raise NoPrefix(session_id=session_id)
        compiled = await self._constraint(constraint)
        seat = session.engine
        window = seat.window
        # With sinks a Decode may run past the window (engine.generate says
        # when it cannot: a constraint or a reasoning budget stops at its end).
        limit = MAX_STREAM_TOKENS if window is not None else seat.n_ctx
        params = self._bounded(self._params(sampling, limit), compiled, seat.n_ctx)
        self._thinking(params, compiled)
        speculative = self._speculative(sampling, params, compiled)
        held = contextlib.ExitStack()
        engine = await self._wake(session)
        held.callback(self._rest, session)
        try:
            if session.manifest_digest is None:  # restored cold
                raise NoPrefix(session_id=session_id)
            reasoning = self._reasoning(engine, params)
            drafter = None if speculative is None else await self._drafter(
                speculative, self.models[session.model], engine, seat.options, held)
        except BaseException:
            held.close()
            raise
        work = Work(reasoning)

        def run(stop: threading.Event, emit: Emit, first: Callable[[], None],
                think: Think) -> str:
            if window is not None:
                def emit(text: str, tokens: int, emit: Emit = emit) -> None:
                    window.journal.append(text)
                    emit(text, tokens)
            try:
                with engine.lock:
                    if speculative is not None:
                        if window is not None and len(engine.continuation()) >= engine.n_ctx:
                            engine.shift(window, 2)  # room to go on; drafts fit the rest
                        reason, work.drafted, work.accepted = engine.speculate(
                            engine.continuation(), params, stop, emit, drafter=drafter,
                            draft_max=speculative.draft_max or DRAFT_MAX, pace=self.pace,
                            first=first)
                        return reason
                    return engine.generate(
                        engine.continuation(), params, stop, emit, pace=self.pace, first=first,
                        logits_processor=self._processor(engine, compiled),
                        reasoning=reasoning, think=think, window=window)
            finally:
                if window is not None:
                    work.shifted = window.take_shifted()

        def after() -> None:  # on the loop, once the worker has ended
            if window is not None and work.shifted and session.prefix_tokens > window.sinks:
                # Only the sinks of the prefix are still resident.
                session.prefix_tokens = window.sinks
                window.prefix_cut = True

        held.callback(after)
        work.run = run
        async for reply in self._stream(work.run, held.close, received, work.final):
            yield reply

    @implements
    def ExplainContext(self, *, session_id: str) -> ContextReport:
        session = self._session(session_id)
        seat = session.engine
        resident = len(seat.engine.resident()) if seat.engine else seat.spilled_tokens
        manifest = ContextManifest(**session.manifest) if session.manifest else None
        return {
            "resident_tokens": resident,
            "prefix_tokens": session.prefix_tokens,
            "n_ctx": seat.n_ctx,
            "available_tokens": seat.n_ctx - resident,
            "stable_byte_hash": session.stable_byte_hash,
            "stable_token_hash": session.stable_token_hash,
            "manifest_digest": session.manifest_digest or "",
            "manifest": manifest,
            "closed": session.closed,
            "shifted_tokens": seat.window.shifted if seat.window else None,
            "journal": seat.window.journal.text() if seat.window else None,
            "journal_total_bytes": seat.window.journal.total if seat.window else None,
        }

    @implements
    async def Close(self, *, session_id: str) -> None:
        try:
            session = self.table.remove(session_id)
        except UnknownSession:
            raise SessionNotFound(session_id=session_id) from None
        except StaleSession as error:
            raise StaleOwner(session_id=session_id, owner_instance_id=error.owner) from None

        await self._free(session)

    @implements
    def GetLoad(self) -> LoadResult:
        now = time.monotonic()
        models = []
        for name, m in sorted(self.models.items()):
            sessions = sum(s.model == name for s in self.table)
            # Each open session holds its model once; the rest are requests.
            models.append(LoadedModel(name=name, resident_bytes=m.size,
                                      busy=max(0, m.busy - sessions), sessions=sessions,
                                      keep_alive_s=self._keep_alive_left(name, m, now),
                                      batch_free=m.batcher.free_slots if m.batcher else None))
        return {
            "free_slots": self.slots.free,
            "total_slots": self.slots.total,
            "resident_bytes": sum(m.size for m in self.models.values()),
            "loaded_models": sorted(self.models),
            "queue_depth": self.slots.queue_depth,
            "models": models,
            "spilled_sessions": len(self.spill),
        }

    async def aclose(self) -> None:
        """Wait for running generations, then free every context and fd."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
        for session in self.table:
            self.table.remove(session.session_id)
            if session.engine.engine is not None:
                await asyncio.to_thread(session.engine.engine.close)
        await asyncio.to_thread(self.spill.clear)
        for resident in self.models.values():
            await asyncio.to_thread(resident.close)
        self.models.clear()
