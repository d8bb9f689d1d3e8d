"""The Varlink face of runtimed: io.syntrop.Runtime1.

Each method validates, takes what the request needs (its model, a slot),
hands the work to the model's engine worker and answers with what comes
back. llama.cpp never runs in this process: every model lives in a worker
process of its own (the worker package), started and watched by
residency.py and supervisor.py, so a native fault ends that model's calls
with EngineCrashed while every other model, and this face, go on.

Kept in this process, on the event loop, is what spans models: the slots
and their queue (slots.py), the session table with its owner fence
(sessions.py), spilled session state (spill.py), what to shed under memory
pressure, and the CPU choice for the engine (cpu.py), made once. What a
call asks for is checked first (checks.py); models, their workers and
keep-alive are residency.py's.

Streams (Complete, Chat, Decode) are relayed by streams.py: each piece the
worker sends goes out at once; when the client goes away the call is
cancelled in the worker, and its slot and model go back once the worker
has stopped.

Spill: a session holds a slot while its context is live. When a request
needs a slot and none is free, the least recently used idle session is
spilled: its worker writes its state into a memfd that comes here (kept in
memory, or in a file beyond the byte budget), and closes the context; the
next call on it takes a slot again and hands the state back.
"""

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from asyncvarlink import AnnotatedResult

from syntrop.config import Paths
from syntrop.interfaces import names
from syntrop.interfaces.runtime import (
    Busy,
    ChatMessage,
    Constraint,
    ContextManifest,
    ContextReport,
    Embedding,
    EmbedResult,
    EngineCrashed,
    EngineResult,
    EngineVariant,
    EngineWorker,
    LoadedModel,
    LoadResult,
    NoPrefix,
    NotAuthorized,
    OpenSessionResult,
    PrefixStatus,
    Runtime1,
    Sampling,
    SessionConfig,
    SessionLost,
    SessionNotFound,
    StaleOwner,
    SuffixStatus,
    UnloadResult,
)
from syntrop.runtimed import checks
from syntrop.runtimed import sessions as sessions_mod
from syntrop.runtimed.config import Config, load
from syntrop.runtimed.protocol import Options
from syntrop.runtimed.residency import Residency, Resident, check_name, crashed, lane_of
from syntrop.runtimed.sessions import SessionTable, StaleSession, UnknownSession
from syntrop.runtimed.slots import Slots, SlotsBusy
from syntrop.runtimed.spill import SpillStore
from syntrop.runtimed.streams import relay
from syntrop.runtimed.supervisor import Call, Exit, WorkerGone, WorkerProcess
from syntrop.varlink import InvalidParameter, authz, current_peer, implements

if TYPE_CHECKING:
    from syntrop.runtimed.cpu import Choice
    from syntrop.runtimed.journal import Journal

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: Tasks left running for a caller that went away (kept from the collector).
_BACKGROUND: set["asyncio.Future[Any]"] = set()

MAX_TEXT = 1 << 20
MAX_MESSAGES = 256
MAX_INPUTS = 256
ROLES = ("system", "user", "assistant")
#: Most tokens one Decode of a session with sinks may generate.
MAX_STREAM_TOKENS = 1 << 20


@dataclass(eq=False, slots=True, kw_only=True)
class Seat:
    """A session, runtimed's side: where its context is (live in its
    model's worker, or spilled here), and what the worker does not keep."""

    options: Options
    n_ctx: int
    #: The resident model the session holds (released once, on close).
    resident: Resident
    #: The context is live in the worker (False: spilled, or lost).
    in_worker: bool = True
    #: Calls using the seat now (a spill waits for none; Close for all).
    busy: int = 0
    quiet: asyncio.Event = field(default_factory=asyncio.Event)
    used: float = field(default_factory=time.monotonic)
    resident_tokens: int = 0
    #: Resident tokens while spilled.
    spilled_tokens: int = 0
    #: The session's LoRA adapter (its name in modeld).
    lora: str | None = None
    #: With sinks: how many, the journal of generated text, tokens dropped
    #: by shifts so far, and whether a shift cut the prefix.
    sinks: int | None = None
    journal: "Journal | None" = None
    shifted: int = 0
    prefix_cut: bool = False
    #: Why the session is gone (its worker died); None while it lives.
    lost: str | None = None
    released: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _completed(coroutine: Coroutine[Any, Any, T],
               undo: Callable[[T], Awaitable[None]] | None = None) -> Awaitable[T]:
    """Run `coroutine` to its end even if the caller is cancelled: it changes
    state on both sides of a worker (a context made, saved or restored), and
    stopping it halfway would leave them disagreeing. When the caller has
    gone, `undo` gets the result (what nobody will ever use is given back)."""
    task = asyncio.ensure_future(coroutine)
    _BACKGROUND.add(task)

    def finished(done: "asyncio.Future[T]") -> None:
        _BACKGROUND.discard(task)
        if done.cancelled() or done.exception() is not None:
            return  # an error nobody waits for any more: nothing to undo
        if undo is not None and abandoned:
            undoing = asyncio.ensure_future(undo(done.result()))
            _BACKGROUND.add(undoing)
            undoing.add_done_callback(_BACKGROUND.discard)

    abandoned = False
    task.add_done_callback(finished)

    async def wait() -> T:
        nonlocal abandoned
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            abandoned = True
            raise

    return wait()


#: Priorities a generation may name (leases.py's lanes).
PRIORITIES = ("EmergencyTriage", "Interactive", "Batch")


async def _triage(priority: str | None) -> bool:
    """Whether a request with `priority` goes to the triage lane: only
    EmergencyTriage, and only for root or holders of sentry's triage
    authorization (it is never frozen for anyone)."""
    if priority is None or priority in ("Interactive", "Batch"):
        return False
    if priority not in PRIORITIES:
        raise InvalidParameter(parameter="priority")
    await authz.authorize(authz.TRIAGE, NotAuthorized)
    return True


def _cached(resident: Resident, result: dict[str, Any]) -> None:
    """A stream's result: what the worker's idle contexts hold now (a
    cancelled or failed stream's result may say nothing of it)."""
    if isinstance(result.get("prefixes"), list):
        resident.prefixes = [str(d) for d in result["prefixes"]]
        resident.cached_contexts = int(result.get("cached_contexts") or 0)


class RuntimeService(Runtime1):
    """Runs GGUF models, each in an engine worker, with persistent sessions."""

    def __init__(self, paths: Paths, config: Config | None = None) -> None:
        self.paths = paths
        self.config = config or load(paths.configuration)
        self.slots = Slots(self.config.slots, self.config.queue)
        self.table: SessionTable[Seat] = SessionTable()
        self.spill = SpillStore(paths.state / "spill", self.config.spill_ram)
        self.residency = Residency(paths.socket(names.MODEL), self.config, self.engine,
                                   inference=paths.socket(names.INFERENCE))
        self.residency.on_crash = self._crashed
        self.residency.in_use = self._in_use
        self.residency.on_pressure = self._shed
        self._choice: asyncio.Future[Choice] | None = None
        self._trace = os.environ.get("SYNTROP_RUNTIMED_TRACE")

    @property
    def models(self) -> dict[str, Resident]:
        return self.residency.models

    # the engine -----------------------------------------------------------------

    async def engine(self) -> "Choice":
        """The CPU code every worker runs, probed once (cpu.py)."""
        if self._choice is None:
            from syntrop.runtimed import cpu

            self._choice = asyncio.ensure_future(asyncio.to_thread(cpu.probe))
            choice = await asyncio.shield(self._choice)
            logger.info("%s (%s)", choice.describe(), choice.reason)
        return await asyncio.shield(self._choice)

    def _open(self, resident: Resident, op: str, args: dict[str, Any],
              fds: Sequence[int] = (), *, label: str) -> Call:
        try:
            return resident.worker.open(op, args, fds, label=label)
        except WorkerGone as gone:
            raise crashed(resident.name, gone) from None

    async def _call(self, resident: Resident, op: str, args: dict[str, Any],
                    fds: Sequence[int] = (), *, label: str) -> dict[str, Any]:
        try:
            return await resident.worker.request(op, args, fds, label=label)
        except WorkerGone as gone:
            raise crashed(resident.name, gone) from None

    async def _stream(self, resident: Resident, call: Call, done: Callable[[], None],
                      received: float, *, on_text: Callable[[str], None] | None = None,
                      on_result: Callable[[dict[str, Any]], None] | None = None,
                      ) -> AsyncIterator[AnnotatedResult]:
        try:
            async for reply in relay(resident.worker, call, done=done, received=received,
                                     trace=self._trace, on_text=on_text, on_result=on_result):
                yield reply
        except WorkerGone as gone:
            raise crashed(resident.name, gone) from None

    def _crashed(self, worker: WorkerProcess, exit: Exit, calls: list[str]) -> None:
        """A model's worker died: its sessions are lost (their slots and
        spilled state freed now; each answers SessionLost until closed)."""
        model = worker.model
        lost = 0
        for session in self.table:
            seat = session.engine
            if seat.resident.worker is not worker or seat.lost is not None:
                continue
            seat.lost = exit.describe()
            if seat.in_worker:
                seat.in_worker = False
                self.slots.release()
            else:
                self.spill.drop(session.session_id)
            lost += 1
        if lost:
            logger.warning("%d sessions of %s were lost with its engine", lost, model)

    # models ---------------------------------------------------------------------

    async def _adapter(self, name: str) -> int:
        """A LoRA adapter's descriptor from modeld, its bytes checked against
        the digest modeld reports (the worker checks it against the model)."""
        check_name(name, "config.lora")
        fd, _, _ = await self.residency.open_verified(name)
        return fd

    async def _draft(self, resident: Resident, name: str) -> None:
        try:
            await self.residency.load_draft(resident, name)
        except WorkerGone as gone:
            raise crashed(resident.name, gone) from None

    def _in_use(self, resident: Resident) -> bool:
        """Held by a call, or by a session (spilled ones too)."""
        return resident.busy > 0 or any(s.engine.resident is resident for s in self.table)

    async def _shed(self) -> None:
        """Under memory pressure, beyond unloading idle models: close the
        contexts kept for later requests, spill every idle session (its
        context freed) and move spilled state from memory to files."""
        closed = 0
        for resident in list(self.models.values()):
            closed += int((await self._call(resident, "trim", {}, label="trim"))["closed"])
        spilled = 0
        while await self._spill_one(None):
            spilled += 1
        moved = await asyncio.to_thread(self.spill.flush)
        if closed or spilled or moved:
            logger.info("memory pressure: closed %d idle contexts, spilled %d sessions, "
                        "moved %d bytes of session state to disk", closed, spilled, moved)

    async def _hold(self, model: str, *, triage: bool = False) -> Resident:
        return await self.residency.hold(model, triage=triage)

    @implements
    async def Unload(self, *, model: str | None = None) -> UnloadResult:
        await authz.authorize(authz.MANAGE_RUNTIME, NotAuthorized)
        if model is not None:
            check_name(model)
        async with self.residency.loading:
            now = time.monotonic()
            names = [n for n in self.models if model is None or lane_of(n)[0] == model]
            idle = [n for n in names
                    if self.residency.keep_alive_left(self.models[n], now) is not None]
            freed = await self.residency.unload(idle, "asked to")
        return {"unloaded": idle, "in_use": [n for n in names if n not in idle],
                "freed_bytes": freed}

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
        """Spill the least recently used idle session; whether one was. A
        session of the triage lane is never spilled: sentry's warm prefix
        must be there when a failure comes."""
        idle = [s for s in self.table if s.engine.in_worker and not s.engine.busy
                and not s.engine.lock.locked() and s.engine is not keep
                and not s.engine.resident.triage]
        if not idle:
            return False
        session = min(idle, key=lambda s: s.engine.used)
        return await _completed(self._spill(session))

    async def _spill(self, session: sessions_mod.Session[Seat]) -> bool:
        seat = session.engine
        async with seat.lock:
            if not seat.in_worker:  # spilled (or lost) meanwhile
                return True
            try:
                result, fds = await seat.resident.worker.request_fds(
                    "save", {"session": session.session_id}, label="spill")
            except WorkerGone:
                return False  # its sessions are lost: _crashed freed the slot
            except Exception as error:
                logger.warning("cannot spill session %s: %s",
                               sessions_mod.tag(session.session_id), error)
                return False
            if seat.lost is not None:  # the worker died right after answering
                for fd in fds:
                    os.close(fd)
                return True
            seat.in_worker, seat.spilled_tokens = False, int(result["tokens"])
            self.slots.release()
            try:
                await asyncio.to_thread(self.spill.put, session.session_id, fds[0])
            except OSError as error:  # it comes back cold (NoPrefix)
                logger.warning("spilled state of session %s lost: %s",
                               sessions_mod.tag(session.session_id),
                               error)
        where = "a file" if self.spill.on_disk(session.session_id) else "memory"
        logger.info("spilled session %s (%d tokens, %d bytes) to %s",
                    sessions_mod.tag(session.session_id),
                    seat.spilled_tokens, int(result["bytes"]), where)
        return True

    async def _wake(self, session: sessions_mod.Session[Seat]) -> None:
        """Make sure the session's context is live in its worker (restoring
        a spilled one); the seat counts as busy until `_rest`."""
        seat = session.engine
        seat.busy += 1
        seat.quiet.clear()
        try:
            await _completed(self._ready(session))
        except BaseException:
            self._rest(session)
            raise

    async def _ready(self, session: sessions_mod.Session[Seat]) -> None:
        seat = session.engine
        async with seat.lock:
            self._check_lost(session)
            if not seat.in_worker:
                await self._restore(session)

    def _rest(self, session: sessions_mod.Session[Seat]) -> None:
        seat = session.engine
        seat.busy -= 1
        seat.used = time.monotonic()
        if not seat.busy:
            seat.quiet.set()

    async def _restore(self, session: sessions_mod.Session[Seat]) -> None:
        seat = session.engine
        await self._slot(keep=seat)
        fd: int | None = None
        try:
            with contextlib.suppress(KeyError, OSError):
                fd = await asyncio.to_thread(self.spill.take, session.session_id)
            result = await self._call(seat.resident, "restore",
                                      {"session": session.session_id, "lora": seat.lora},
                                      [fd] if fd is not None else [], label="restore")
            # The worker may have died right after answering: the session
            # is lost then, and _crashed did not count this slot.
            self._check_lost(session)
        except BaseException:
            self.slots.release()
            raise
        finally:
            if fd is not None:
                os.close(fd)
        seat.in_worker = True
        seat.resident_tokens = int(result["resident"])
        if result.get("cold"):
            # The state is lost (a spill file removed or damaged): the
            # session goes on cold, and says so (NoPrefix until EnsurePrefix).
            logger.warning("session %s restored cold", sessions_mod.tag(session.session_id))
            session.manifest = session.manifest_digest = None
            session.prefix_tokens = 0
        else:
            logger.info("restored session %s (%d tokens)", sessions_mod.tag(session.session_id),
                        seat.resident_tokens)

    # streams --------------------------------------------------------------------

    async def _generate(self, model: str, sampling: Sampling | None, prompt: dict[str, Any],
                        constraint: Constraint | None, label: str, priority: str | None = None,
                        ) -> AsyncIterator[AnnotatedResult]:
        received = time.monotonic()
        triage = await _triage(priority)
        options = checks.options(None, self.config)
        compiled = await checks.constraint(constraint)
        params = checks.bounded(checks.params(sampling, options.n_ctx), compiled, options.n_ctx)
        checks.thinking(params, compiled)
        speculative = checks.speculative(sampling, params, compiled)
        # What the request holds, given back (in reverse) when its work ends.
        held = contextlib.ExitStack()
        try:
            resident = await self._hold(model, triage=triage)
            held.callback(resident.release)
            if not triage:  # the triage lane's worker has contexts of its own
                await self._slot()
                held.callback(self.slots.release)
            if speculative is not None and speculative.draft is not None:
                await self._draft(resident, speculative.draft)
            if self.config.layout == "batch" and speculative is None:
                resident.batch_running = (resident.batch_running or 0) + 1
                held.callback(self._batch_left, resident)
            call = self._open(resident, "generate",
                              {**prompt, "options": asdict(options),
                               **checks.decoding(params, compiled, speculative)}, label=label)
        except BaseException:
            held.close()
            raise
        async for reply in self._stream(resident, call, held.close, received,
                                        on_result=functools.partial(_cached, resident)):
            yield reply

    @staticmethod
    def _batch_left(resident: Resident) -> None:
        resident.batch_running = max(0, (resident.batch_running or 1) - 1)

    @implements
    async def Complete(
        self, *, model: str, prompt: str, sampling: Sampling | None = None,
        constraint: Constraint | None = None, priority: str | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        if len(prompt) > MAX_TEXT:
            raise InvalidParameter(parameter="prompt")
        async for reply in self._generate(model, sampling, {"prompt": prompt}, constraint,
                                          "Complete", priority):
            yield reply

    @implements
    async def Chat(
        self, *, model: str, messages: list[ChatMessage], sampling: Sampling | None = None,
        constraint: Constraint | None = None, priority: str | None = None,
        continue_last: bool | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        if not messages or len(messages) > MAX_MESSAGES:
            raise InvalidParameter(parameter="messages")
        if any(m.role not in ROLES or len(m.content) > MAX_TEXT for m in messages):
            raise InvalidParameter(parameter="messages")
        if continue_last and (messages[-1].role != "assistant" or not messages[-1].content):
            raise InvalidParameter(parameter="continue_last")
        turns = [[m.role, m.content] for m in messages]
        prompt: dict[str, Any] = {"messages": turns}
        if continue_last:
            prompt["continue_last"] = True
        async for reply in self._generate(model, sampling, prompt, constraint,
                                          "Chat", priority):
            yield reply

    @implements
    async def Embed(self, *, model: str, input: list[str]) -> EmbedResult:
        if not input or len(input) > MAX_INPUTS or any(len(t) > MAX_TEXT for t in input):
            raise InvalidParameter(parameter="input")
        options = checks.options(None, self.config, embedding=True)
        resident = await self._hold(model)
        try:
            await self._slot()
            try:
                result = await self._call(resident, "embed",
                                          {"input": input, "options": asdict(options)},
                                          label="Embed")
            finally:
                self.slots.release()
        finally:
            resident.release()
        vectors = result["vectors"]
        return {"embeddings": [Embedding(vector=v) for v in vectors],
                "dimensions": len(vectors[0]) if vectors else 0}

    # sessions -------------------------------------------------------------------

    @staticmethod
    def _may(uid: int) -> bool:
        """Whether the caller may act on a session `uid` opened: its opener,
        root, or runtimed itself. To anyone else it does not exist."""
        return authz.privileged(current_peer(), uid)

    def _session(self, session_id: str) -> sessions_mod.Session[Seat]:
        try:
            session = self.table.get(session_id, self._may)
        except UnknownSession:
            raise SessionNotFound(session_id=session_id) from None
        except StaleSession as error:
            raise StaleOwner(session_id=session_id, owner_instance_id=error.owner) from None
        self._check_lost(session)
        return session

    @staticmethod
    def _check_lost(session: sessions_mod.Session[Seat]) -> None:
        if session.engine.lost is not None:
            raise SessionLost(session_id=session.session_id, model=session.model,
                              reason=f"its engine {session.engine.lost}")

    async def _free(self, session: sessions_mod.Session[Seat]) -> None:
        """Close a removed session's context once no call uses it, and free
        its slot, or drop its spilled state; release its model. Runs to
        its end even if the caller goes away."""
        await _completed(self._freeing(session))

    async def _freeing(self, session: sessions_mod.Session[Seat]) -> None:
        seat = session.engine
        try:
            while seat.busy:
                await seat.quiet.wait()
            async with seat.lock:
                if seat.lost is None:
                    if not seat.in_worker:
                        await asyncio.to_thread(self.spill.drop, session.session_id)
                    try:
                        # The worker keeps a spilled seat's adapter: it forgets both.
                        await self._call(seat.resident, "close",
                                         {"session": session.session_id}, label="Close")
                    except EngineCrashed:
                        pass  # gone with its worker
                    finally:
                        if seat.in_worker and seat.lost is None:
                            seat.in_worker = False
                            self.slots.release()
        finally:
            if not seat.released:
                seat.released = True
                seat.resident.release()

    @implements
    async def OpenSession(
        self, *, owner_instance_id: str, model: str, config: SessionConfig | None = None,
        priority: str | None = None,
    ) -> OpenSessionResult:
        if not owner_instance_id or len(owner_instance_id) > 256:
            raise InvalidParameter(parameter="owner_instance_id")
        triage = await _triage(priority)
        options = checks.options(config, self.config)
        sinks, journal = checks.window(config, options.n_ctx)
        prompt_format = checks.prompt_format(config)
        lora = config.lora if config else None
        scale = config.lora_scale if config and config.lora_scale is not None else 1.0
        if not 0.0 <= scale <= 4.0:
            raise InvalidParameter(parameter="config.lora_scale")
        lora_fd = await self._adapter(lora) if lora is not None else None
        try:
            resident = await self._hold(model, triage=triage)
            try:
                for ended in self.table.fence(owner_instance_id, current_peer().uid):
                    logger.info("session %s ended by a takeover",
                                sessions_mod.tag(ended.session_id))
                    with contextlib.suppress(EngineCrashed):  # gone with its worker
                        await self._free(ended)
                await self._slot()
            except BaseException:
                resident.release()
                raise
        except BaseException:
            if lora_fd is not None:
                os.close(lora_fd)
            raise
        session = await _completed(
            self._open_session(resident, owner_instance_id, model, options, config,
                               sinks, journal, lora, scale, lora_fd, prompt_format),
            undo=self._abandoned)
        return {"session_id": session.session_id, "owner_instance_id": owner_instance_id}

    async def _open_session(self, resident: Resident, owner: str, model: str, options: Options,
                            config: SessionConfig | None, sinks: int | None,
                            journal: "Journal | None", lora: str | None, scale: float,
                            lora_fd: int | None, prompt_format: str | None = None,
                            ) -> sessions_mod.Session[Seat]:
        """The worker's context for a new session (the caller holds a slot
        and the model; both are given back on failure), and its entry. Owns
        `lora_fd` (the worker gets a copy)."""
        session_id = os.urandom(16).hex()
        try:
            result = await self._call(
                resident, "open", {"session": session_id, "options": asdict(options),
                                   "lora": lora, "lora_scale": scale, "sinks": sinks,
                                   "prompt_format": prompt_format},
                [lora_fd] if lora_fd is not None else [], label="OpenSession")
            if not resident.worker.alive:  # died right after answering
                raise crashed(model, WorkerGone(model, resident.worker.exit,
                                                resident.worker.gone_reason()))
        except BaseException:
            self.slots.release()
            resident.release()
            raise
        finally:
            if lora_fd is not None:
                os.close(lora_fd)
        seat = Seat(options=options, n_ctx=int(result["n_ctx"]), resident=resident, lora=lora,
                    sinks=sinks, journal=journal)
        seat.quiet.set()
        return self.table.add(owner=owner, model=model, engine=seat,
                              add_bos=not (config and config.disable_bos), session_id=session_id,
                              uid=current_peer().uid)

    async def _abandoned(self, session: sessions_mod.Session[Seat]) -> None:
        """A session opened for a caller that went away before it learnt the
        id: nobody can use or close it, so it is closed now."""
        with contextlib.suppress(UnknownSession, StaleSession):
            self.table.remove(session.session_id)
        with contextlib.suppress(Exception):
            await self._free(session)

    @implements
    async def EnsurePrefix(
        self, *, session_id: str, text: str, manifest: ContextManifest
    ) -> PrefixStatus:
        session = self._session(session_id)
        if len(text) > MAX_TEXT:
            raise InvalidParameter(parameter="text")
        key = asdict(manifest)
        digest = sessions_mod.manifest_digest(key)
        seat = session.engine
        await self._wake(session)
        try:
            result = await self._call(seat.resident, "prefix", {
                "session": session_id, "text": text, "add_bos": session.add_bos,
                "current_digest": session.manifest_digest, "digest": digest},
                label="EnsurePrefix")
        finally:
            self._rest(session)
        session.prefix_tokens = int(result["prefix_tokens"])
        session.stable_token_hash = str(result["token_hash"])
        seat.resident_tokens = int(result["resident"])
        session.manifest, session.manifest_digest = key, digest
        session.stable_byte_hash = sessions_mod.sha256_hex(text.encode())
        seat.prefix_cut = False
        return {
            "reused_tokens": int(result["reused"]),
            "prefilled_tokens": int(result["prefilled"]),
            "dropped_tokens": int(result["dropped"]),
            "prefix_tokens": session.prefix_tokens,
            "resident_tokens": session.prefix_tokens,
            "available_tokens": seat.n_ctx - session.prefix_tokens,
            "stable_byte_hash": session.stable_byte_hash,
            "stable_token_hash": session.stable_token_hash,
            "manifest_digest": digest,
        }

    @implements
    async def PrefillSuffix(
        self, *, session_id: str, text: str, manifest: ContextManifest
    ) -> SuffixStatus:
        session = self._session(session_id)
        seat = session.engine
        if session.manifest_digest is None or seat.prefix_cut:
            # No prefix yet, or a shift dropped part of it: EnsurePrefix first.
            raise NoPrefix(session_id=session_id)
        if sessions_mod.manifest_digest(asdict(manifest)) != session.manifest_digest:
            raise InvalidParameter(parameter="manifest")
        if len(text) > MAX_TEXT:
            raise InvalidParameter(parameter="text")
        await self._wake(session)
        try:
            if session.manifest_digest is None:  # restored cold
                raise NoPrefix(session_id=session_id)
            result = await self._call(seat.resident, "suffix", {
                "session": session_id, "text": text, "prefix_tokens": session.prefix_tokens},
                label="PrefillSuffix")
        finally:
            self._rest(session)
        count = int(result["count"])
        seat.resident_tokens = int(result["resident"])
        resident = session.prefix_tokens + count
        return {
            "suffix_tokens": count,
            "prefix_tokens": session.prefix_tokens,
            "resident_tokens": resident,
            "available_tokens": seat.n_ctx - resident,
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
        compiled = await checks.constraint(constraint)
        seat = session.engine
        # With sinks a Decode may run past the window (the worker says when
        # it cannot: a constraint or a reasoning budget stops at its end).
        limit = MAX_STREAM_TOKENS if seat.sinks is not None else seat.n_ctx
        params = checks.bounded(checks.params(sampling, limit), compiled, seat.n_ctx)
        checks.thinking(params, compiled)
        speculative = checks.speculative(sampling, params, compiled)
        held = contextlib.ExitStack()
        await self._wake(session)
        held.callback(self._rest, session)
        try:
            if session.manifest_digest is None:  # restored cold
                raise NoPrefix(session_id=session_id)
            if speculative is not None and speculative.draft is not None:
                await self._draft(seat.resident, speculative.draft)
            call = self._open(seat.resident, "decode",
                              {"session": session_id,
                               **checks.decoding(params, compiled, speculative)},
                              label="Decode")
        except BaseException:
            held.close()
            raise

        def on_result(result: dict[str, Any]) -> None:
            seat.resident_tokens = int(result.get("resident", seat.resident_tokens))
            shifted = int(result.get("shifted_tokens") or 0)
            if seat.sinks is not None and shifted:
                seat.shifted += shifted
                if session.prefix_tokens > seat.sinks:
                    # Only the sinks of the prefix are still resident.
                    session.prefix_tokens = seat.sinks
                    seat.prefix_cut = True

        journal = seat.journal
        async for reply in self._stream(seat.resident, call, held.close, received,
                                        on_text=journal.append if journal is not None else None,
                                        on_result=on_result):
            yield reply

    @implements
    def ExplainContext(self, *, session_id: str) -> ContextReport:
        session = self._session(session_id)
        seat = session.engine
        resident = seat.resident_tokens if seat.in_worker else seat.spilled_tokens
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
            "shifted_tokens": seat.shifted if seat.sinks is not None else None,
            "journal": seat.journal.text() if seat.journal is not None else None,
            "journal_total_bytes": seat.journal.total if seat.journal is not None else None,
        }

    @implements
    async def Close(self, *, session_id: str) -> None:
        try:
            session = self.table.remove(session_id, self._may)
        except UnknownSession:
            raise SessionNotFound(session_id=session_id) from None
        except StaleSession as error:
            raise StaleOwner(session_id=session_id, owner_instance_id=error.owner) from None
        await self._free(session)

    # load and engine ------------------------------------------------------------

    @implements
    def GetLoad(self) -> LoadResult:
        now = time.monotonic()
        models = []
        for name, m in sorted(self.models.items()):
            sessions = sum(s.engine.resident is m for s in self.table)
            # Each open session holds its model once; the rest are requests.
            batch_free = None if m.batch_running is None else \
                max(0, self.config.slots - m.batch_running)
            models.append(LoadedModel(name=name, resident_bytes=m.size,
                                      busy=max(0, m.busy - sessions), sessions=sessions,
                                      keep_alive_s=self.residency.keep_alive_left(m, now),
                                      batch_free=batch_free, prefixes=m.prefixes,
                                      cached_contexts=m.cached_contexts))
        return {
            "free_slots": self.slots.free,
            "total_slots": self.slots.total,
            "resident_bytes": sum(m.size for m in self.models.values()),
            "loaded_models": sorted(self.models),
            "queue_depth": self.slots.queue_depth,
            "models": models,
            "spilled_sessions": len(self.spill),
        }

    @implements
    async def GetEngine(self) -> EngineResult:
        choice = await self.engine()
        now = time.monotonic()
        workers: list[EngineWorker] = []
        crashes = self.residency.crashes
        window = self.config.crash_window
        for at in sorted(set(self.models) | set(crashes)):
            name, triage = lane_of(at)
            resident = self.models.get(at)
            record = crashes.get(at)
            recent = [t for t in record.times if now - t <= window] if record else []
            retry = None
            state = "running"
            if resident is None:
                state = "crashed"
                if self.config.crash_limit and len(recent) >= self.config.crash_limit:
                    state, retry = "failing", round(max(0.0, recent[0] + window - now), 1)
                elif not recent:
                    continue  # crashed long ago, not running now: nothing to say
            worker = resident.worker if resident is not None else None
            last = record.last if record else None
            workers.append(EngineWorker(
                model=name, pid=worker.pid if worker else None, state=state,
                started_at=worker.started if worker else None,
                calls=worker.served if worker else 0, crashes=len(recent),
                last_exit=last.describe() if last else None,
                last_signal=last.signal if last else None,
                last_calls=list(record.last_calls) if record else [], retry_after_s=retry,
                lane="triage" if triage else None,
                lease_id=resident.lease.lease_id if resident and resident.lease else None,
                lease_bytes=resident.lease.memory if resident and resident.lease else None,
                cgroup=resident.cgroup if resident else None))
        info = next((r.worker.system_info for r in self.models.values() if r.worker.system_info),
                    None)
        return {
            "cpu": choice.cpu, "build": choice.build, "variant": choice.variant,
            "variants": [EngineVariant(name=n, score=s) for n, s in
                         sorted(choice.scores.items(), key=lambda item: -item[1])],
            "amx": choice.amx.detail, "extra_buffer_types": choice.extra_bufts,
            "reason": choice.reason, "system_info": info, "workers": workers,
        }

    async def aclose(self) -> None:
        """Stop every worker and drop spilled state."""
        for session in self.table:
            self.table.remove(session.session_id)
        await asyncio.to_thread(self.spill.clear)
        await self.residency.close()
