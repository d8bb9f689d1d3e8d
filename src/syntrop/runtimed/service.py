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
open while the model is resident.
"""

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict

from asyncvarlink import AnnotatedResult

from syntrop.config import Paths
from syntrop.interfaces import model as model_contract
from syntrop.interfaces.model import Model1
from syntrop.interfaces.runtime import (
    Busy,
    ChatMessage,
    Chunk,
    ContextManifest,
    ContextOverflow,
    ContextReport,
    Embedding,
    EmbedResult,
    InvalidModel,
    InvalidSampling,
    LoadResult,
    ModelNotFound,
    NoPrefix,
    OpenSessionResult,
    PrefixStatus,
    Runtime1,
    Sampling,
    SessionConfig,
    SessionNotFound,
    StaleOwner,
    SuffixStatus,
    WeightsMismatch,
)
from syntrop.runtimed import sessions as sessions_mod
from syntrop.runtimed.config import Config, load
from syntrop.runtimed.engine import Emit, Engine, LoadError, Options, Overflow
from syntrop.runtimed.models import Resident, WeightsDiffer
from syntrop.runtimed.sampling import Params, SamplingError, validate
from syntrop.runtimed.sessions import (
    SessionTable,
    StaleSession,
    UnknownSession,
)
from syntrop.runtimed.slots import Slots, SlotsBusy
from syntrop.varlink import InvalidParameter, implements
from syntrop.varlink.client import connect

logger = logging.getLogger(__name__)

MAX_NAME = 256
MAX_TEXT = 1 << 20
MAX_MESSAGES = 256
MAX_INPUTS = 256
ROLES = ("system", "user", "assistant")
MODELD_TIMEOUT = 30.0

Item = Chunk | BaseException


class RuntimeService(Runtime1):
    """Runs GGUF models with persistent sessions."""

    def __init__(self, paths: Paths, config: Config | None = None) -> None:
        self.paths = paths
        self.config = config or load(paths.configuration)
        self.slots = Slots(self.config.slots, self.config.queue)
        self.models: dict[str, Resident] = {}
        self.table: SessionTable[Engine] = SessionTable()
        self._loading = asyncio.Lock()
        self._workers: set[asyncio.Future[None]] = set()

    # models ---------------------------------------------------------------------

    async def _resident(self, name: str) -> Resident:
        """The model, made resident from modeld's descriptor if it is not."""
        if not name or len(name) > MAX_NAME or "\0" in name:
            raise InvalidParameter(parameter="model")
        async with self._loading:
            if name in self.models:
                return self.models[name]
            try:
                async with await connect(Model1, address=self.paths.socket(Model1.name),
                                         timeout=MODELD_TIMEOUT) as modeld:
                    with await modeld.OpenModel(name=name) as reply:
                        fd = os.dup(reply["fd"].fileno())
                        digest, size = str(reply["digest"]), int(reply["size"])
            except (model_contract.ModelNotFound, model_contract.InvalidIdentifier):
                raise ModelNotFound(model=name) from None
            except OSError as error:
                logger.warning("cannot reach modeld: %s", error)
                raise ModelNotFound(model=name) from None
            try:
                resident = await asyncio.to_thread(Resident.open, name, fd, digest, size)
            except WeightsDiffer as error:
                raise WeightsMismatch(expected=error.expected, actual=error.actual) from None
            except LoadError as error:
                raise InvalidModel(model=name, reason=error.reason) from None
            self.models[name] = resident
            logger.info("loaded %s (sha256 %s)", name, resident.digest)
            return resident

    def _options(self, config: SessionConfig | None = None, *, embedding: bool = False) -> Options:
        c = config or SessionConfig(n_ctx=None, n_batch=None, n_threads=None, n_gpu_layers=None,
                                    flash_attn=None, kv_cache_type=None, prompt_format=None,
                                    disable_bos=None)
        checks = (("n_ctx", c.n_ctx, 16, 1 << 17), ("n_batch", c.n_batch, 1, 1 << 14),
                  ("n_threads", c.n_threads, 0, 1024), ("n_gpu_layers", c.n_gpu_layers, 0, 1024))
        for parameter, value, low, high in checks:
            if value is not None and not low <= value <= high:
                raise InvalidParameter(parameter=f"config.{parameter}")
        if c.kv_cache_type not in (None, ""):
            raise InvalidParameter(parameter="config.kv_cache_type")
        return Options(
            n_ctx=c.n_ctx or self.config.n_ctx,
            n_batch=c.n_batch or 512,
            n_threads=c.n_threads if c.n_threads is not None else self.config.n_threads,
            n_gpu_layers=c.n_gpu_layers or 0,
            flash_attn=bool(c.flash_attn),
            embedding=embedding,
        )

    async def _slot(self) -> None:
        try:
            await self.slots.acquire()
        except SlotsBusy as error:
            raise Busy(queue_depth=error.queue_depth) from None

    # streams --------------------------------------------------------------------

    def _params(self, sampling: Sampling | None, n_ctx: int) -> Params:
        s = sampling or Sampling(max_tokens=None, temperature=None, top_p=None, top_k=None,
                                 seed=None, stop=None)
        try:
            return validate(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                            top_k=s.top_k, seed=s.seed, stop=s.stop, n_ctx=n_ctx)
        except SamplingError as error:
            raise InvalidSampling(parameter=error.parameter, reason=error.reason) from None

    async def _stream(
        self, work: Callable[[threading.Event, Emit], str], done: Callable[[], None]
    ) -> AsyncIterator[AnnotatedResult]:
        """Run `work` in a thread and stream its pieces; `done` runs on the
        loop once the thread has ended, whatever happened to the client."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Item] = asyncio.Queue()
        stop = threading.Event()

        def put(item: Item) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def emit(text: str, tokens: int) -> None:
            put(Chunk(text=text, tokens=tokens, finish_reason=None))

        def run() -> None:
            try:
                reason = work(stop, emit)
            except BaseException as error:  # handed to the loop, raised there
                put(error)
            else:
                put(Chunk(text="", tokens=0, finish_reason=reason))

        future = loop.run_in_executor(None, run)
        self._workers.add(future)

        def finished(f: asyncio.Future[None]) -> None:
            self._workers.discard(f)
            done()

        future.add_done_callback(finished)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Overflow):
                    raise ContextOverflow(tokens=item.tokens, n_ctx=item.n_ctx)
                if isinstance(item, BaseException):
                    logger.error("generation failed", exc_info=item)
                    raise RuntimeError("generation failed")
                last = item.finish_reason is not None
                yield AnnotatedResult({"chunk": item}, continues=not last)
                if last:
                    return
        finally:
            stop.set()

    async def _generate(self, model: str, sampling: Sampling | None,
                        prompt: Callable[[Engine], tuple[list[int], tuple[str, ...]]],
                        ) -> AsyncIterator[AnnotatedResult]:
        resident = await self._resident(model)
        options = self._options()
        params = self._params(sampling, options.n_ctx)
        await self._slot()
        try:
            engine = await asyncio.to_thread(resident.take, options)
        except BaseException:
            self.slots.release()
            raise

        def work(stop: threading.Event, emit: Emit) -> str:
            tokens, stops = prompt(engine)
            return engine.generate(tokens, params, stop, emit, extra_stops=stops)

        def done() -> None:
            resident.give(options, engine)
            self.slots.release()

        async for reply in self._stream(work, done):
            yield reply

    @implements
    async def Complete(
        self, *, model: str, prompt: str, sampling: Sampling | None = None
    ) -> AsyncIterator[AnnotatedResult]:
        if len(prompt) > MAX_TEXT:
            raise InvalidParameter(parameter="prompt")
        async for reply in self._generate(
            model, sampling, lambda engine: (engine.tokenize(prompt, add_bos=True), ())
        ):
            yield reply

    @implements
    async def Chat(
        self, *, model: str, messages: list[ChatMessage], sampling: Sampling | None = None
    ) -> AsyncIterator[AnnotatedResult]:
        if not messages or len(messages) > MAX_MESSAGES:
            raise InvalidParameter(parameter="messages")
        if any(m.role not in ROLES or len(m.content) > MAX_TEXT for m in messages):
            raise InvalidParameter(parameter="messages")
        turns = [(m.role, m.content) for m in messages]
        async for reply in self._generate(model, sampling,
                                          lambda engine: engine.chat_prompt(turns)):
            yield reply

    @implements
    async def Embed(self, *, model: str, input: list[str]) -> EmbedResult:
        if not input or len(input) > MAX_INPUTS or any(len(t) > MAX_TEXT for t in input):
            raise InvalidParameter(parameter="input")
        resident = await self._resident(model)
        options = self._options(embedding=True)
        await self._slot()
        try:
            engine = await asyncio.to_thread(resident.take, options)
            try:
                vectors = await asyncio.to_thread(engine.embed, input)
            except Overflow as error:
                raise ContextOverflow(tokens=error.tokens, n_ctx=error.n_ctx) from None
            finally:
                resident.give(options, engine)
        finally:
            self.slots.release()
        return {"embeddings": [Embedding(vector=v) for v in vectors],
                "dimensions": len(vectors[0]) if vectors else 0}

    # sessions -------------------------------------------------------------------

    def _session(self, session_id: str) -> sessions_mod.Session[Engine]:
        try:
            return self.table.get(session_id)
        except UnknownSession:
            raise SessionNotFound(session_id=session_id) from None
        except StaleSession as error:
            raise StaleOwner(session_id=session_id, owner_instance_id=error.owner) from None

    async def _free(self, engine: Engine) -> None:
        """Close a session's context (after any generation on it) and free its slot."""

        def work() -> None:
            with engine.lock:
                engine.close()

        try:
            await asyncio.to_thread(work)
        finally:
            self.slots.release()

    @implements
    async def OpenSession(
        self, *, owner_instance_id: str, model: str, config: SessionConfig | None = None
    ) -> OpenSessionResult:
        if not owner_instance_id or len(owner_instance_id) > MAX_NAME:
            raise InvalidParameter(parameter="owner_instance_id")
        options = self._options(config)
        resident = await self._resident(model)
        for ended in self.table.fence(owner_instance_id):
            logger.info("session %s ended by a takeover", ended.session_id)
            await self._free(ended.engine)
        await self._slot()
        try:
            engine = await asyncio.to_thread(Engine.load, resident.fd, options)
        except BaseException:
            self.slots.release()
            raise
        session = self.table.add(owner=owner_instance_id, model=model, engine=engine,
                                 add_bos=not (config and config.disable_bos))
        return {"session_id": session.session_id, "owner_instance_id": owner_instance_id}

    @implements
    async def EnsurePrefix(
        self, *, session_id: str, text: str, manifest: ContextManifest
    ) -> PrefixStatus:
        session = self._session(session_id)
        if len(text) > MAX_TEXT:
            raise InvalidParameter(parameter="text")
        engine = session.engine
        key = asdict(manifest)
        digest = sessions_mod.manifest_digest(key)

        def work() -> sessions_mod.Plan:
            with engine.lock:
                tokens = engine.tokenize(text, add_bos=session.add_bos)
                engine.check_fits(len(tokens))
                plan = sessions_mod.plan_prefix(engine.resident(), session.manifest_digest,
                                                tokens, digest)
                engine.prefill(plan.reused, plan.prefill)
                session.prefix_tokens = len(tokens)
                session.stable_token_hash = sessions_mod.token_hash(tokens)
                return plan

        try:
            plan = await asyncio.to_thread(work)
        except Overflow as error:
            raise ContextOverflow(tokens=error.tokens, n_ctx=error.n_ctx) from None
        session.manifest, session.manifest_digest = key, digest
        session.stable_byte_hash = sessions_mod.sha256_hex(text.encode())
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
        if session.manifest_digest is None:
            raise NoPrefix(session_id=session_id)
        if sessions_mod.manifest_digest(asdict(manifest)) != session.manifest_digest:
            raise InvalidParameter(parameter="manifest")
        if len(text) > MAX_TEXT:
            raise InvalidParameter(parameter="text")
        engine = session.engine

        def work() -> int:
            with engine.lock:
                tokens = engine.tokenize(text, add_bos=False)
                engine.prefill(session.prefix_tokens, tokens)
                return len(tokens)

        try:
            count = await asyncio.to_thread(work)
        except Overflow as error:
            raise ContextOverflow(tokens=error.tokens, n_ctx=error.n_ctx) from None
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
        self, *, session_id: str, sampling: Sampling | None = None
    ) -> AsyncIterator[AnnotatedResult]:
        session = self._session(session_id)
        if session.manifest_digest is None:
            raise NoPrefix(session_id=session_id)
        engine = session.engine
        params = self._params(sampling, engine.n_ctx)

        def work(stop: threading.Event, emit: Emit) -> str:
            with engine.lock:
                return engine.generate(engine.resident(), params, stop, emit)

        async for reply in self._stream(work, lambda: None):
            yield reply

    @implements
    def ExplainContext(self, *, session_id: str) -> ContextReport:
        session = self._session(session_id)
        resident = len(session.engine.resident())
        manifest = ContextManifest(**session.manifest) if session.manifest else None
        return {
            "resident_tokens": resident,
            "prefix_tokens": session.prefix_tokens,
            "n_ctx": session.engine.n_ctx,
            "available_tokens": session.engine.n_ctx - resident,
            "stable_byte_hash": session.stable_byte_hash,
            "stable_token_hash": session.stable_token_hash,
            "manifest_digest": session.manifest_digest or "",
            "manifest": manifest,
            "closed": session.closed,
        }

    @implements
    async def Close(self, *, session_id: str) -> None:
        try:
            session = self.table.remove(session_id)
        except UnknownSession:
            raise SessionNotFound(session_id=session_id) from None
        except StaleSession as error:
            raise StaleOwner(session_id=session_id, owner_instance_id=error.owner) from None

        await self._free(session.engine)

    @implements
    def GetLoad(self) -> LoadResult:
        return {
            "free_slots": self.slots.free,
            "total_slots": self.slots.total,
            "resident_bytes": sum(m.size for m in self.models.values()),
            "loaded_models": sorted(self.models),
            "queue_depth": self.slots.queue_depth,
        }

    async def aclose(self) -> None:
        """Wait for running generations, then free every context and fd."""
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
        for session in self.table:
            self.table.remove(session.session_id)
            await asyncio.to_thread(session.engine.close)
        for resident in self.models.values():
            await asyncio.to_thread(resident.close)
        self.models.clear()
