"""sentry's warm triage session: a persistent runtimed session that holds
the stable part of the decide prompt (decide.prefix_messages()), so an
incident only prefills its own turn and decodes its answer.

Lifecycle. `start()` opens the session in the background (sentry's first
reply is not delayed): Runtime1.OpenSession for the triage model, then
EnsurePrefix with the prefix rendered as ChatML. A session declares its
prompt format (SessionConfig.prompt_format) but takes text, not messages,
so the rendering is ours; runtimed checks at OpenSession that the model's
chat template writes ChatML (another format is refused, and the decide
phase then says so). A keeper connection stays open while sentry runs: it
keeps a socket-activated runtimed from exiting on idle, and every
`HEARTBEAT` seconds it asks ExplainContext, so a restarted runtimed, a
crashed worker (SessionLost) or a takeover (StaleOwner) is seen before the
next incident and the session is reopened in the background.

Per incident: PrefillSuffix (runtimed keeps the prefix's tokens and drops
whatever followed them: the previous incident's turn and answer), then
Decode under the answer's constraint. A call that finds the session gone
reopens it once and tries again.
"""

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from syntrop.interfaces.clients import Runtime1Client
    from syntrop.interfaces.runtime import Constraint, PrefixStatus, Sampling

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Seconds between the keeper's looks at the session.
HEARTBEAT = 5.0
#: Seconds between attempts to open a session that could not be opened.
RETRY_MIN, RETRY_MAX = 5.0, 300.0
#: Seconds a single Runtime1 call may take (the budgets bound them first).
CALL_TIMEOUT = 120.0
#: Seconds sentry's stop waits for the session to be closed.
CLOSE_TIMEOUT = 2.0
PROMPT_FORMAT = "chatml"
PROFILE = "systemd-sentry triage"
#: Errors that say the session is gone (and a new one would work).
GONE = ("SessionNotFound", "SessionLost", "StaleOwner", "NoPrefix", "EngineCrashed")


class NoTriageModel(RuntimeError):
    """modeld holds no triage model (and sentry.toml names none): the rules
    decide until one appears."""


def chatml(messages: list[tuple[str, str]], *, answer: bool = False) -> str:
    """(role, content) pairs as ChatML; with `answer`, the assistant's turn
    opened after them (what a chat template's generation prompt writes)."""
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return text + ("<|im_start|>assistant\n" if answer else "")


def gone(error: BaseException) -> bool:
    """Whether `error` means the session (or runtimed) is gone: reopen."""
    from asyncvarlink import VarlinkErrorReply

    if isinstance(error, VarlinkErrorReply):
        return error.name.rpartition(".")[2] in GONE
    return isinstance(error, (ConnectionError, EOFError))


@dataclass(frozen=True, slots=True, kw_only=True)
class Opened:
    """A session with its prefix resident."""

    session_id: str
    model: str
    #: The prefix as given to EnsurePrefix, and its cache key.
    text: str
    manifest: Any  # interfaces.runtime.ContextManifest
    prefix_tokens: int
    #: EnsurePrefix's reused tokens when it was opened (0: cold).
    reused_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    text: str
    tokens: int
    #: Prefix tokens kept from before this incident (PrefillSuffix's reply).
    prefix_tokens: int
    suffix_tokens: int
    #: Whether the session had to be reopened for it.
    reopened: bool
    #: Seconds PrefillSuffix took, and Decode.
    prefill_s: float = 0.0
    decode_s: float = 0.0


class WarmSession:
    """The triage session; `model` says which model (name, weights digest)."""

    def __init__(self, model: Callable[[], Awaitable[tuple[str, str]]],
                 prefix: Callable[[], list[tuple[str, str]]],
                 address: str | None = None) -> None:
        self._model = model
        self._prefix = prefix
        self._address = address
        self.owner = f"systemd-sentry:{os.getpid()}:{os.urandom(8).hex()}"
        self._opening: asyncio.Task[Opened] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        #: Sessions opened so far (1 at start; more after reopening).
        self.opened = 0
        #: The model the session being opened, or open, is for.
        self._for: str | None = None

    async def _connect(self) -> "Runtime1Client":
        from syntrop.interfaces.runtime import Runtime1
        from syntrop.varlink.client import connect

        return await connect(Runtime1, address=self._address, timeout=CALL_TIMEOUT)

    def start(self) -> None:
        """Open the session in the background and keep it."""
        self._reopen()
        if self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def _reopen(self) -> None:
        """Open a new session unless one is being opened now."""
        if self._opening is None or self._opening.done():
            self._opening = asyncio.get_running_loop().create_task(self._open())
            self._opening.add_done_callback(_seen)

    async def ready(self) -> Opened:
        """The session, once open with its prefix; opens one (once) if the
        last attempt failed. Shielded: an impatient caller does not stop it."""
        if self._opening is None or _failed(self._opening):
            self._reopen()
        assert self._opening is not None
        return await asyncio.shield(self._opening)

    async def _open(self) -> Opened:
        from syntrop.interfaces.runtime import ContextManifest, SessionConfig
        from syntrop.system.digest import sha256

        model, digest = await self._model()
        self._for = model
        config = SessionConfig(n_ctx=None, n_batch=None, n_threads=None, n_gpu_layers=None,
                               flash_attn=None, kv_cache_type=None,
                               prompt_format=PROMPT_FORMAT, disable_bos=None)
        text = chatml(self._prefix())
        manifest = ContextManifest(
            profile=PROFILE, model=model, model_digest=digest, tokenizer_digest=digest,
            template_digest=PROMPT_FORMAT, bos="add",
            runtime_digest=str(sha256(repr(config).encode()).hexdigest()))
        async with await self._connect() as runtime:
            # The triage lane's worker: never frozen by sentry's own
            # exclusive lease, never spilled, and at a higher CPU weight.
            reply = await runtime.OpenSession(owner_instance_id=self.owner, model=model,
                                              config=config, priority="EmergencyTriage")
            session_id = reply["session_id"]
            try:
                status = await runtime.EnsurePrefix(session_id=session_id, text=text,
                                                    manifest=manifest)
            except BaseException:
                with contextlib.suppress(Exception):
                    await runtime.Close(session_id=session_id)
                raise
        self.opened += 1
        opened = Opened(session_id=session_id, model=model, text=text, manifest=manifest,
                        prefix_tokens=status["prefix_tokens"],
                        reused_tokens=status["reused_tokens"])
        logger.info("triage session %s… on %s: %d prefix tokens", session_id[:8], model,
                    opened.prefix_tokens)
        return opened

    async def follow(self, model: str) -> None:
        """The session for `model`: one opened (or being opened) for another
        model (modeld's holdings changed) is closed and a new one opened."""
        async with self._lock:
            if self._for is None or self._for == model:
                return
            old, self._opening, self._for = self._opening, None, None
            logger.info("triage model is now %s: reopening the session", model)
            self._reopen()
        if old is not None:
            if not old.done():
                old.cancel()
            elif not _failed(old):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._close(old.result().session_id),
                                           CLOSE_TIMEOUT)

    def describe(self) -> str:
        """Where the session stands, for Sentry1.GetStatus: "ready: ...",
        "opening" or "failed: ..."."""
        task = self._opening
        if task is None or not task.done():
            return "opening"
        if task.cancelled():
            return "failed: cancelled"
        error = task.exception()
        if error is not None:
            return f"failed: {type(error).__name__}: {error}"[:200]
        opened = task.result()
        return f"ready: {opened.model}, {opened.prefix_tokens} prefix tokens resident"

    async def ensure(self) -> tuple[Opened, int, int]:
        """The session with its prefix resident: EnsurePrefix with the same
        text again, which keeps every resident token (and brings back a
        session runtimed spilled), before an incident's budget starts. A
        session found gone is reopened once. Returns it, and the tokens
        reused and prefilled."""
        async def ensure(opened: Opened, _: bool) -> tuple[Opened, "PrefixStatus"]:
            return opened, await self._ensure(opened)

        opened, status = await self._in_session(ensure)
        return opened, status["reused_tokens"], status["prefilled_tokens"]

    async def _in_session(self, use: Callable[[Opened, bool], Awaitable[T]]) -> T:
        """`use(session, reopened)`, one call at a time in the one session;
        a session found gone is reopened, and `use` tried again, once."""
        async with self._lock:
            opened = await self.ready()
            try:
                return await use(opened, False)
            except Exception as error:
                if not gone(error):
                    raise
                logger.info("triage session %s… gone (%s): reopening", opened.session_id[:8],
                            error)
                self._lost(opened)
            return await use(await self.ready(), True)

    async def _ensure(self, opened: Opened) -> "PrefixStatus":
        async with await self._connect() as runtime:
            return await runtime.EnsurePrefix(session_id=opened.session_id, text=opened.text,
                                              manifest=opened.manifest)

    async def answer(self, suffix: str, sampling: "Sampling | None",
                     constraint: "Constraint | None",
                     on_chunk: Callable[[str, int], None]) -> Answer:
        """Prefill the incident's turn after the prefix and decode the
        answer; `on_chunk(text so far, tokens so far)` as it comes. A
        session found gone is reopened once."""
        return await self._in_session(lambda opened, reopened: self._answer(
            opened, suffix, sampling, constraint, on_chunk, reopened=reopened))

    async def _answer(self, opened: Opened, suffix: str, sampling: "Sampling | None",
                      constraint: "Constraint | None",
                      on_chunk: Callable[[str, int], None], *, reopened: bool) -> Answer:
        text, tokens = "", 0
        async with await self._connect() as runtime:
            started = time.monotonic()
            status = await runtime.PrefillSuffix(session_id=opened.session_id, text=suffix,
                                                 manifest=opened.manifest)
            prefilled = time.monotonic()
            async for reply in runtime.Decode(session_id=opened.session_id,
                                              sampling=sampling, constraint=constraint):
                text += reply["chunk"].text
                tokens += reply["chunk"].tokens
                on_chunk(text, tokens)
        return Answer(text=text, tokens=tokens,
                      prefix_tokens=status["prefix_tokens"],
                      suffix_tokens=status["suffix_tokens"], reopened=reopened,
                      prefill_s=prefilled - started, decode_s=time.monotonic() - prefilled)

    def _lost(self, opened: Opened) -> None:
        """`opened` is gone: open another, unless a newer one is there."""
        current = self._opening
        if current is not None and current.done() and not _failed(current) \
                and current.result() is opened:
            self._opening = None
        if self._opening is None:
            self._reopen()

    async def _keep(self) -> None:
        """Hold a connection to runtimed (it does not exit on idle while
        one is open) and look at the session every HEARTBEAT seconds."""
        retry = RETRY_MIN
        runtime: Runtime1Client | None = None
        try:
            while True:
                opened: Opened | None = None
                try:
                    model, _ = await self._model()
                    await self.follow(model)
                    opened = await self.ready()
                    if runtime is None:
                        runtime = await self._connect()
                    await runtime.ExplainContext(session_id=opened.session_id)
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    if runtime is not None:
                        runtime.close()
                        runtime = None
                    if opened is not None and gone(error):
                        logger.info("triage session %s… gone (%s): reopening",
                                    opened.session_id[:8], error)
                        self._lost(opened)
                        continue
                    if isinstance(error, NoTriageModel):
                        # Looked for at every heartbeat: the session opens
                        # as soon as the model is pulled.
                        await asyncio.sleep(HEARTBEAT)
                        continue
                    logger.warning("no triage session (%s); trying again in %.0f s",
                                   error, retry)
                    await asyncio.sleep(retry)
                    retry = min(retry * 2, RETRY_MAX)
                    continue
                retry = RETRY_MIN
                await asyncio.sleep(HEARTBEAT)
        finally:
            if runtime is not None:
                runtime.close()

    async def close(self) -> None:
        """Stop keeping the session and close it."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(BaseException):
                await self._keeper
            self._keeper = None
        opening, self._opening = self._opening, None
        if opening is None:
            return
        if not opening.done():
            opening.cancel()
            return
        if opening.cancelled() or opening.exception() is not None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._close(opening.result().session_id), CLOSE_TIMEOUT)

    async def _close(self, session_id: str) -> None:
        async with await self._connect() as runtime:
            await runtime.Close(session_id=session_id)


def _failed(task: "asyncio.Task[Any]") -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


def _seen(task: "asyncio.Task[Any]") -> None:
    if not task.cancelled():
        task.exception()
