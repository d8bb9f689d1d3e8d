"""Sessions, runtimed's side: where each session's context is (live in its
model's worker, or spilled here), and the slots they hold.

A session holds a slot while its context is live. When a request needs a
slot and none is free, the least recently used idle session is spilled:
its worker writes its state into a memfd that comes here (kept in memory,
or in a file beyond the byte budget: spill.py), and closes the context; the
next call on it takes a slot again and hands the state back. When a
model's worker dies its sessions are lost: their slots and spilled state
are freed at once, and each answers SessionLost until closed.

Errors are the face's own (WorkerGone, SlotsBusy, ...): service.py turns
them into the contract's.
"""

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from syntrop.interfaces.runtime import SessionLost
from syntrop.runtimed import protocol
from syntrop.runtimed import sessions as sessions_mod
from syntrop.runtimed.protocol import Options
from syntrop.runtimed.residency import Resident
from syntrop.runtimed.sessions import SessionTable
from syntrop.runtimed.slots import Slots
from syntrop.runtimed.spill import SpillStore
from syntrop.runtimed.supervisor import Exit, WorkerGone, WorkerProcess

if TYPE_CHECKING:
    from syntrop.runtimed.journal import Journal

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: Tasks left running for a caller that went away (kept from the collector).
_BACKGROUND: set["asyncio.Future[Any]"] = set()

Session = sessions_mod.Session["Seat"]


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


def completed(coroutine: Coroutine[Any, Any, T],
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


class Seats:
    """The session table and what its sessions hold: a slot while live,
    spilled state while not, their model until closed."""

    def __init__(self, slots: Slots, spill: SpillStore) -> None:
        self.slots = slots
        self.spill = spill
        self.table: SessionTable[Seat] = SessionTable()

    def __iter__(self) -> Iterator[Session]:
        return iter(self.table)

    def lost(self, worker: WorkerProcess, exit: Exit) -> None:
        """A model's worker died: its sessions are lost (their slots and
        spilled state freed now; each answers SessionLost until closed)."""
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
            logger.warning("%d sessions of %s were lost with its engine", lost, worker.model)

    def in_use(self, resident: Resident) -> bool:
        """Whether a session holds `resident` (spilled ones too)."""
        return any(s.engine.resident is resident for s in self.table)

    async def take_slot(self, keep: Seat | None = None) -> None:
        """Take a slot; when none is free, spill the least recently used idle
        session (never `keep`) rather than wait (SlotsBusy when the queue
        is full)."""
        if self.slots.free == 0 and not self.slots.queue_depth:
            await self.spill_one(keep)
        await self.slots.acquire()

    # spill ----------------------------------------------------------------------

    async def spill_one(self, keep: Seat | None) -> bool:
        """Spill the least recently used idle session; whether one was. A
        session of the triage lane is never spilled: sentry's warm prefix
        must be there when a failure comes."""
        idle = [s for s in self.table if s.engine.in_worker and not s.engine.busy
                and not s.engine.lock.locked() and s.engine is not keep
                and not s.engine.resident.triage]
        if not idle:
            return False
        session = min(idle, key=lambda s: s.engine.used)
        return await completed(self._spill(session))

    async def _spill(self, session: Session) -> bool:
        seat = session.engine
        async with seat.lock:
            if not seat.in_worker:  # spilled (or lost) meanwhile
                return True
            try:
                result, fds = await seat.resident.worker.request_fds(
                    protocol.Save(session=session.session_id), label="spill")
            except WorkerGone:
                return False  # its sessions are lost: `lost` freed the slot
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

    async def wake(self, session: Session) -> None:
        """Make sure the session's context is live in its worker (restoring
        a spilled one); the seat counts as busy until `rest`."""
        seat = session.engine
        seat.busy += 1
        seat.quiet.clear()
        try:
            await completed(self._ready(session))
        except BaseException:
            self.rest(session)
            raise

    async def _ready(self, session: Session) -> None:
        seat = session.engine
        async with seat.lock:
            self.check_lost(session)
            if not seat.in_worker:
                await self._restore(session)

    def rest(self, session: Session) -> None:
        seat = session.engine
        seat.busy -= 1
        seat.used = time.monotonic()
        if not seat.busy:
            seat.quiet.set()

    async def _restore(self, session: Session) -> None:
        seat = session.engine
        await self.take_slot(keep=seat)
        fd: int | None = None
        try:
            with contextlib.suppress(KeyError, OSError):
                fd = await asyncio.to_thread(self.spill.take, session.session_id)
            result = await seat.resident.worker.request(
                protocol.Restore(session=session.session_id, lora=seat.lora),
                [fd] if fd is not None else [], label="restore")
            # The worker may have died right after answering: the session
            # is lost then, and `lost` did not count this slot.
            self.check_lost(session)
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

    @staticmethod
    def check_lost(session: Session) -> None:
        if session.engine.lost is not None:
            raise SessionLost(session_id=session.session_id, model=session.model,
                              reason=f"its engine {session.engine.lost}")

    async def free(self, session: Session) -> None:
        """Close a removed session's context once no call uses it, and free
        its slot, or drop its spilled state; release its model. Runs to
        its end even if the caller goes away."""
        await completed(self._freeing(session))

    async def _freeing(self, session: Session) -> None:
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
                        await seat.resident.worker.request(
                            protocol.Close(session=session.session_id), label="Close")
                    except WorkerGone:
                        pass  # gone with its worker
                    finally:
                        if seat.in_worker and seat.lost is None:
                            seat.in_worker = False
                            self.slots.release()
        finally:
            if not seat.released:
                seat.released = True
                seat.resident.release()
