"""The Varlink face of runtimed: io.syntrop.Runtime1.

Each method validates, takes what the request needs (its model, a slot),
hands the work to the model's engine worker and answers with what comes
back. llama.cpp never runs in this process: every model lives in a worker
process of its own (the worker package), started and watched by
residency.py and supervisor.py, so a native fault ends that model's calls
with EngineCrashed while every other model, and this face, go on.

Kept in this process, on the event loop, is what spans models: the slots
and their queue (slots.py), the sessions with their owner fence and
spilled state (seats.py), what to shed under memory pressure, and the CPU
choice for the engine (cpu.py), made once. What a call asks for is checked
first (checks.py); models, their workers and keep-alive are residency.py's.
The face's own errors become the contract's in one table (ERRORS);
a worker's come as the declared errors they name (supervisor.py).

Speak runs a voice (an ONNX model in modeld) in an engine worker like any
model's (worker/voice.py): same process, same residency, same slots; its
packets are relayed as they are cut.

Streams (Complete, Chat, Decode) are relayed by streams.py: each piece the
worker sends goes out at once; when the client goes away the call is
cancelled in the worker, and its slot and model go back once the worker
has stopped.
"""

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from asyncvarlink import AnnotatedResult, FileDescriptor

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
    EngineResult,
    LoadResult,
    NoPrefix,
    NotAuthorized,
    OpenSessionResult,
    PrefillResult,
    PrefixStatus,
    Runtime1,
    Sampling,
    SessionConfig,
    SessionNotFound,
    StaleOwner,
    SuffixStatus,
    UnloadResult,
)
from syntrop.runtimed import checks, protocol, reports
from syntrop.runtimed import sessions as sessions_mod
from syntrop.runtimed.config import Config, load
from syntrop.runtimed.protocol import Options
from syntrop.runtimed.residency import Residency, Resident, check_name, crashed, lane_of
from syntrop.runtimed.seats import Seat, Seats, Session, completed
from syntrop.runtimed.sessions import StaleSession, UnknownSession
from syntrop.runtimed.slots import Slots, SlotsBusy
from syntrop.runtimed.spill import SpillStore
from syntrop.runtimed.streams import relay, relay_speech
from syntrop.runtimed.supervisor import Call, WorkerGone
from syntrop.varlink import InvalidParameter, authz, current_peer, implements

if TYPE_CHECKING:
    from syntrop.runtimed.cpu import Choice
    from syntrop.runtimed.journal import Journal

logger = logging.getLogger(__name__)

MAX_TEXT = 1 << 20
#: Who besides root (and polkit's runtime.manage) may export and import a
#: prompt's state (Prefill, Chat's prefix_state): routerd's fleet hand-off.
#: Unload stays root's and polkit's.
HANDOFF = (authz.ROUTER_USER,)
MAX_MESSAGES = 256
MAX_INPUTS = 256
ROLES = ("system", "user", "assistant")
#: Most characters one Speak says.
MAX_SPEECH = 4096
#: Speak's pace, as a factor of the voice's.
SPEEDS = (0.5, 2.0)
#: Most tokens one Decode of a session with sinks may generate.
MAX_STREAM_TOKENS = 1 << 20


def _cached(resident: Resident, result: dict[str, Any]) -> None:
    """A stream's result: what the worker's idle contexts hold now (a
    cancelled or failed stream's result may say nothing of it)."""
    if isinstance(result.get("prefixes"), list):
        resident.prefixes = [str(d) for d in result["prefixes"]]
        resident.cached_contexts = int(result.get("cached_contexts") or 0)


#: The face's domain errors as the contract's: the one place they are mapped.
ERRORS: dict[type[Exception], Callable[[Any], Exception]] = {
    WorkerGone: lambda gone: crashed(lane_of(gone.model)[0], gone),
    SlotsBusy: lambda busy: Busy(queue_depth=busy.queue_depth),
    UnknownSession: lambda unknown: SessionNotFound(session_id=unknown.session_id),
    StaleSession: lambda stale: StaleOwner(session_id=stale.session_id,
                                           owner_instance_id=stale.owner),
}


def _turns(messages: list[ChatMessage]) -> tuple[tuple[str, str], ...]:
    """A chat's messages as the worker takes them; InvalidParameter when
    there are none, too many, or one is too long or of an unknown role."""
    if not messages or len(messages) > MAX_MESSAGES or \
            any(m.role not in ROLES or len(m.content) > MAX_TEXT for m in messages):
        raise InvalidParameter(parameter="messages")
    return tuple((m.role, m.content) for m in messages)


@contextlib.contextmanager
def contract() -> Iterator[None]:
    """Raise the face's domain errors (ERRORS) as the contract's."""
    try:
        yield
    except tuple(ERRORS) as error:
        mapped = next(to for cls, to in ERRORS.items() if isinstance(error, cls))
        raise mapped(error) from None


class RuntimeService(Runtime1):
    """Runs GGUF models, each in an engine worker, with persistent sessions."""

    def __init__(self, paths: Paths, config: Config | None = None) -> None:
        self.paths = paths
        self.config = config or load(paths.configuration)
        self.slots = Slots(self.config.slots, self.config.queue)
        self.seats = Seats(self.slots, SpillStore(paths.state / "spill", self.config.spill_ram))
        self.residency = Residency(paths.socket(names.MODEL), self.config, self.engine,
                                   inference=paths.socket(names.INFERENCE))
        self.residency.on_crash = lambda worker, exit, _calls: self.seats.lost(worker, exit)
        self.residency.in_use = self._in_use
        self.residency.on_pressure = self._shed
        self._choice: asyncio.Future[Choice] | None = None
        self._trace = os.environ.get("SYNTROP_RUNTIMED_TRACE")

    @property
    def models(self) -> dict[str, Resident]:
        return self.residency.models

    def keep_alive(self) -> bool:
        """No idle exit while an idle model's keep-alive runs: its sweep
        unloads the model when that ends, and the next idle check exits.
        A model only a session holds does not count (sessions never end
        by themselves), nor does one whose keep-alive is spent."""
        now = time.monotonic()
        return any((self.residency.keep_alive_left(resident, now) or 0.0) > 0.0
                   for resident in self.models.values())

    # the engine -----------------------------------------------------------------

    async def engine(self) -> "Choice":
        """The CPU code every worker runs, probed once (cpu.py)."""
        if self._choice is None:
            from syntrop.runtimed import cpu

            self._choice = asyncio.ensure_future(asyncio.to_thread(cpu.probe))
            choice = await asyncio.shield(self._choice)
            logger.info("%s (%s)", choice.describe(), choice.reason)
        return await asyncio.shield(self._choice)

    def _open(self, resident: Resident, operation: protocol.Operation,
              fds: Sequence[int] = (), *, label: str) -> Call:
        with contract():
            return resident.worker.open(operation, fds, label=label)

    async def _call(self, resident: Resident, operation: protocol.Operation,
                    fds: Sequence[int] = (), *, label: str) -> dict[str, Any]:
        with contract():
            return await resident.worker.request(operation, fds, label=label)

    async def _stream(self, resident: Resident, call: Call, done: Callable[[], None],
                      received: float, *, on_text: Callable[[str], None] | None = None,
                      on_result: Callable[[dict[str, Any]], None] | None = None,
                      ) -> AsyncIterator[AnnotatedResult]:
        with contract():
            async for reply in relay(resident.worker, call, done=done, received=received,
                                     trace=self._trace, on_text=on_text, on_result=on_result):
                yield reply

    # models ---------------------------------------------------------------------

    async def _adapter(self, name: str) -> int:
        """A LoRA adapter's descriptor from modeld, its bytes checked against
        the digest modeld reports (the worker checks it against the model)."""
        check_name(name, "config.lora")
        fd, _, _ = await self.residency.open_verified(name)
        return fd

    async def _draft(self, resident: Resident, name: str) -> None:
        with contract():
            await self.residency.load_draft(resident, name)

    def _in_use(self, resident: Resident) -> bool:
        """Held by a call, or by a session (spilled ones too)."""
        return resident.busy > 0 or self.seats.in_use(resident)

    async def _shed(self) -> None:
        """Under memory pressure, beyond unloading idle models: close the
        contexts kept for later requests, spill every idle session (its
        context freed) and move spilled state from memory to files."""
        closed = 0
        for resident in list(self.models.values()):
            closed += int((await self._call(resident, protocol.Trim(), label="trim"))["closed"])
        spilled = 0
        while await self.seats.spill_one(None):
            spilled += 1
        moved = await asyncio.to_thread(self.seats.spill.flush)
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

    # streams --------------------------------------------------------------------

    async def _generate(self, model: str, sampling: Sampling | None, prompt: protocol.Prompt,
                        constraint: Constraint | None, label: str, priority: str | None = None,
                        state: FileDescriptor | None = None) -> AsyncIterator[AnnotatedResult]:
        received = time.monotonic()
        triage = await checks.triage(priority)
        if state is not None:  # a prefix state: routerd's fleet hand-off, or an operator
            await authz.authorize(authz.MANAGE_RUNTIME, NotAuthorized, allow=HANDOFF)
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
            call = self._open(resident, protocol.Generate(
                prompt=prompt, options=options, digest=resident.digest,
                decoding=checks.decoding(params, compiled, speculative)),
                [state.fileno()] if state is not None else (), label=label)
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
        async for reply in self._generate(model, sampling, protocol.Prompt(text=prompt), constraint,
                                          "Complete", priority):
            yield reply

    @implements
    async def Chat(
        self, *, model: str, messages: list[ChatMessage], sampling: Sampling | None = None,
        constraint: Constraint | None = None, priority: str | None = None,
        continue_last: bool | None = None, prefix_state: FileDescriptor | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        turns = _turns(messages)
        if continue_last and (messages[-1].role != "assistant" or not messages[-1].content):
            raise InvalidParameter(parameter="continue_last")
        prompt = protocol.Prompt(messages=turns, continue_last=bool(continue_last))
        async for reply in self._generate(model, sampling, prompt, constraint,
                                          "Chat", priority, prefix_state):
            yield reply

    @implements
    async def Prefill(self, *, model: str, messages: list[ChatMessage]) -> PrefillResult:
        turns = _turns(messages)
        await authz.authorize(authz.MANAGE_RUNTIME, NotAuthorized, allow=HANDOFF)
        options = checks.options(None, self.config)
        with contextlib.ExitStack() as held:
            resident = await self._hold(model)
            held.callback(resident.release)
            await self._slot()
            held.callback(self.slots.release)
            with contract():
                result, fds = await resident.worker.request_fds(
                    protocol.Export(messages=turns, options=options, digest=resident.digest),
                    label="Prefill")
        if len(fds) != 1:  # cancelled: nobody is waiting for it
            for fd in fds:
                os.close(fd)
            raise InvalidParameter(parameter="messages")
        return {"state": FileDescriptor(fds[0], should_close=True), "tokens": result["tokens"],
                "reused_tokens": result["reused_tokens"],
                "prefilled_tokens": result["prefilled_tokens"]}

    @implements
    async def Embed(self, *, model: str, input: list[str]) -> EmbedResult:
        if not input or len(input) > MAX_INPUTS or any(len(t) > MAX_TEXT for t in input):
            raise InvalidParameter(parameter="input")
        options = checks.options(None, self.config, embedding=True)
        resident = await self._hold(model)
        try:
            await self._slot()
            try:
                result = await self._call(
                    resident, protocol.Embed(input=tuple(input), options=options),
                    label="Embed")
            finally:
                self.slots.release()
        finally:
            resident.release()
        vectors = result["vectors"]
        return {"embeddings": [Embedding(vector=v) for v in vectors],
                "dimensions": len(vectors[0]) if vectors else 0}

    @implements
    async def Speak(
        self, *, model: str, text: str, voice: str | None = None, speed: float | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        if not text.strip() or len(text) > MAX_SPEECH or "\0" in text:
            raise InvalidParameter(parameter="text")
        if voice is not None and not 0 < len(voice) <= 256:
            raise InvalidParameter(parameter="voice")
        if speed is not None and not SPEEDS[0] <= speed <= SPEEDS[1]:
            raise InvalidParameter(parameter="speed")
        held = contextlib.ExitStack()
        try:
            resident = await self._hold(model)
            held.callback(resident.release)
            await self._slot()
            held.callback(self.slots.release)
            call = self._open(resident, protocol.Speak(model=model, text=text,
                                                       voice=voice, speed=speed),
                              label="Speak")
        except BaseException:
            held.close()
            raise
        with contract():
            async for reply in relay_speech(resident.worker, call, done=held.close):
                yield reply

    # sessions -------------------------------------------------------------------

    @staticmethod
    def _may(uid: int) -> bool:
        """Whether the caller may act on a session `uid` opened: its opener or
        root (no other daemon: routerd reaches only the sessions it opened).
        To anyone else it does not exist."""
        return authz.privileged(current_peer(), uid)

    def _session(self, session_id: str) -> Session:
        with contract():
            session = self.seats.table.get(session_id, self._may)
        self.seats.check_lost(session)
        return session

    async def _slot(self) -> None:
        with contract():
            await self.seats.take_slot()

    async def _wake(self, session: Session) -> None:
        with contract():
            await self.seats.wake(session)

    @implements
    async def OpenSession(
        self, *, owner_instance_id: str, model: str, config: SessionConfig | None = None,
        priority: str | None = None,
    ) -> OpenSessionResult:
        if not owner_instance_id or len(owner_instance_id) > 256:
            raise InvalidParameter(parameter="owner_instance_id")
        triage = await checks.triage(priority)
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
                for ended in self.seats.table.fence(owner_instance_id, current_peer().uid):
                    logger.info("session %s ended by a takeover",
                                sessions_mod.tag(ended.session_id))
                    with contextlib.suppress(WorkerGone):  # gone with its worker
                        await self.seats.free(ended)
                await self._slot()
            except BaseException:
                resident.release()
                raise
        except BaseException:
            if lora_fd is not None:
                os.close(lora_fd)
            raise
        session = await completed(
            self._open_session(resident, owner_instance_id, model, options, config,
                               sinks, journal, lora, scale, lora_fd, prompt_format),
            undo=self._abandoned)
        return {"session_id": session.session_id, "owner_instance_id": owner_instance_id}

    async def _open_session(self, resident: Resident, owner: str, model: str, options: Options,
                            config: SessionConfig | None, sinks: int | None,
                            journal: "Journal | None", lora: str | None, scale: float,
                            lora_fd: int | None, prompt_format: str | None = None,
                            ) -> Session:
        """The worker's context for a new session (the caller holds a slot
        and the model; both are given back on failure), and its entry. Owns
        `lora_fd` (the worker gets a copy)."""
        session_id = os.urandom(16).hex()
        try:
            result = await self._call(
                resident, protocol.Open(session=session_id, options=options, lora=lora,
                                        lora_scale=scale, sinks=sinks,
                                        prompt_format=prompt_format),
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
        return self.seats.table.add(owner=owner, model=model, engine=seat,
                              add_bos=not (config and config.disable_bos), session_id=session_id,
                              uid=current_peer().uid)

    async def _abandoned(self, session: Session) -> None:
        """A session opened for a caller that went away before it learnt the
        id: nobody can use or close it, so it is closed now."""
        with contextlib.suppress(UnknownSession, StaleSession):
            self.seats.table.remove(session.session_id)
        with contextlib.suppress(Exception):
            await self.seats.free(session)

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
            result = await self._call(seat.resident, protocol.Prefix(
                session=session_id, text=text, add_bos=session.add_bos,
                current_digest=session.manifest_digest, digest=digest),
                label="EnsurePrefix")
        finally:
            self.seats.rest(session)
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
            result = await self._call(seat.resident, protocol.Suffix(
                session=session_id, text=text, prefix_tokens=session.prefix_tokens),
                label="PrefillSuffix")
        finally:
            self.seats.rest(session)
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
        held.callback(self.seats.rest, session)
        try:
            if session.manifest_digest is None:  # restored cold
                raise NoPrefix(session_id=session_id)
            if speculative is not None and speculative.draft is not None:
                await self._draft(seat.resident, speculative.draft)
            call = self._open(seat.resident, protocol.Decode(
                session=session_id, decoding=checks.decoding(params, compiled, speculative)),
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
        with contract():
            session = self.seats.table.remove(session_id, self._may)
        await self.seats.free(session)

    # load and engine ------------------------------------------------------------

    @implements
    def GetLoad(self) -> LoadResult:
        return reports.load(self.residency, self.seats, self.slots)

    @implements
    async def GetEngine(self) -> EngineResult:
        return reports.engine(await self.engine(), self.residency)

    async def aclose(self) -> None:
        """Stop every worker and drop spilled state."""
        for session in self.seats:
            self.seats.table.remove(session.session_id)
        await asyncio.to_thread(self.seats.spill.clear)
        await self.residency.close()
