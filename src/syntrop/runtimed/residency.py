"""Resident models, runtimed's side: one engine worker per model, who holds
it, when it goes, and what happens when its worker dies.

A model becomes resident on first use: runtimed takes modeld's descriptor
(OpenModel), hashes the bytes behind it against modeld's digest, starts a
worker (supervisor.py) and hands the descriptor over; the worker loads it.
The descriptor's shared lock travels with it, so modeld sees the model in
use for as long as the worker lives.

Every request holds its model (`hold` / `release`), and so does every open
session (`in_use`, from the service); one that nothing holds is unloaded
after the keep-alive, at once under memory pressure (`some avg10` of
`pressure_file` over `unload_pressure`; the service then sheds contexts
and sessions too), or on request: its worker is asked to exit.

A worker that dies unasked is a crash. Its calls fail at once (supervisor.py);
here the model stops being resident, the crash is logged once, with the
signal and the calls it was serving, and counted. The next request starts
a new worker: at once after one crash, after a growing pause after more,
and not at all once `crash_limit` crashes fall within `crash_window`
seconds: then the model is refused (EngineFailing) until the oldest of them
leaves the window. The service learns of each crash through `on_crash`, to
end the sessions that lived in the worker.
"""

import asyncio
import collections
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syntrop.interfaces.runtime import (
    EngineCrashed,
    EngineFailing,
    EnginePlacement,
    EngineWorker,
    InsufficientMemory,
    ModelNotFound,
    WeightsMismatch,
)
from syntrop.runtimed import leases, protocol
from syntrop.runtimed.config import Config
from syntrop.runtimed.layout import CELLS, Board
from syntrop.runtimed.models import WeightsDiffer, open_in_modeld, verified
from syntrop.runtimed.placement import SPLIT_MODES
from syntrop.runtimed.supervisor import Exit, WorkerGone, WorkerProcess
from syntrop.varlink import InvalidParameter

if TYPE_CHECKING:
    from syntrop.runtimed.cpu import Choice
    from syntrop.runtimed.protocol import Placed

logger = logging.getLogger(__name__)

MAX_NAME = 256
MODELD_TIMEOUT = 30.0
#: Pause before restarting a model's worker after its second crash in the
#: window (doubling with each more), and the longest pause.
BACKOFF = 0.5
BACKOFF_MAX = 10.0
#: The lane of sentry's EmergencyTriage requests: a worker of its own per
#: model, keyed `name + TRIAGE` (a space: no model name has one).
TRIAGE = " (triage)"


#: llama.cpp's split modes by number.
SPLIT_NAMES = {number: name for name, number in SPLIT_MODES.items()}


#: How much nicer than the triage lane's worker every other worker runs: a
#: weight of 335 against 1024 (the kernel's table), so a triage decode gets
#: about three times their share of a busy core, without any privilege (a
#: process may always lower its own priority, never raise it).
OTHERS_NICE = 5


def key(name: str, triage: bool = False) -> str:
    """The residency key of a model's worker in a lane."""
    return name + TRIAGE if triage else name


def lane_of(key: str) -> tuple[str, bool]:
    """(model, triage) of a residency key."""
    return (key.removesuffix(TRIAGE), True) if key.endswith(TRIAGE) else (key, False)


def check_name(name: str, parameter: str = "model") -> None:
    if not name or len(name) > MAX_NAME or "\0" in name:
        raise InvalidParameter(parameter=parameter)


def engine_placement(applied: dict[str, Any] | None) -> EnginePlacement | None:
    """GetEngine's placement of a worker, from what it applied."""
    if not applied:
        return None
    split, affinity = applied.get("tensor_split"), applied.get("cpu_affinity")
    return EnginePlacement(
        n_gpu_layers=int(applied["n_gpu_layers"]),
        split_mode=SPLIT_NAMES.get(int(applied["split_mode"]), str(applied["split_mode"])),
        main_gpu=int(applied["main_gpu"]),
        tensor_split=None if split is None else [float(x) for x in split],
        n_threads=int(applied["n_threads"]),
        cpu_affinity=None if affinity is None else [int(x) for x in affinity],
        why=str(applied.get("why", "")))


def placed_line(applied: dict[str, Any] | None) -> str:
    """The placement applied, in the load's log line."""
    placed = engine_placement(applied)
    if placed is None:
        return "not reported"
    return (f"n_gpu_layers {placed.n_gpu_layers}, split {placed.split_mode}, main_gpu "
            f"{placed.main_gpu}, tensor_split {placed.tensor_split}, {placed.n_threads} "
            f"threads, affinity {placed.cpu_affinity} ({placed.why})")


def crashed(model: str, gone: WorkerGone) -> EngineCrashed:
    """The declared error for a call its worker took down."""
    exit = gone.exit
    return EngineCrashed(model=model, signal=exit.signal if exit else None,
                         exit_status=exit.returncode if exit and exit.signal is None else None,
                         reason=gone.reason)


@dataclass(eq=False, slots=True, kw_only=True)
class Resident:
    """A model with a live worker."""

    name: str
    digest: str
    size: int
    worker: WorkerProcess
    busy: int = 0
    last_used: float = field(default_factory=time.monotonic)
    #: Draft models loaded into this worker (for speculative decoding).
    drafts: set[str] = field(default_factory=set)
    #: Layout batch: streams in the worker's shared batch now (None: it
    #: has made no batch yet).
    batch_running: int | None = None
    #: The triage lane's worker (sentry's EmergencyTriage requests).
    triage: bool = False
    #: What the worker's idle contexts held after its last stream
    #: (pool.Pool.cache): chat prefix digests, and how many contexts.
    prefixes: list[str] | None = None
    cached_contexts: int | None = None
    #: The inferenced lease of its memory (None: unleased).
    lease: leases.Held | None = None
    #: Bytes the model needs resident (what the lease asked for).
    need: int = 0
    #: The worker's own cgroup (None: it shares runtimed's).
    cgroup: str | None = None
    #: Where its engine runs, as the worker applied it (protocol.Placed's
    #: fields, n_threads as a context loaded then got them).
    placement: dict[str, Any] | None = None

    def hold(self) -> None:
        """A request or session uses the model: no unloading meanwhile."""
        self.busy += 1

    def release(self) -> None:
        self.busy -= 1
        self.last_used = time.monotonic()

    def idle_for(self, now: float) -> float | None:
        """Seconds since the last release; None while something holds it."""
        return None if self.busy else max(0.0, now - self.last_used)


@dataclass(slots=True)
class Crashes:
    """A model's recent crashes."""

    times: collections.deque[float] = field(default_factory=collections.deque)
    last: Exit | None = None
    last_calls: list[str] = field(default_factory=list)
    total: int = 0


class Residency:
    def __init__(self, socket: Path, config: Config,
                 engine: Callable[[], Awaitable["Choice"]],
                 inference: Path | None = None) -> None:
        self.socket = socket
        self.config = config
        self._engine = engine
        #: Leases from inferenced at `inference` (None: none are taken).
        self.leases = leases.Leases(inference) if inference is not None else None
        self.cgroups = leases.WorkerCgroups()
        self._tasks: set[asyncio.Task[None]] = set()
        self.models: dict[str, Resident] = {}
        self.crashes: dict[str, Crashes] = {}
        #: Called with (model, exit, calls) when a worker crashes.
        self.on_crash: Callable[[WorkerProcess, Exit, list[str]], None] = lambda *_: None
        #: Whether something besides calls holds a model (the service's
        #: sessions), and what to shed besides idle models under pressure.
        self.in_use: Callable[[Resident], bool] = lambda resident: resident.busy > 0
        self.on_pressure: Callable[[], Awaitable[None]] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.loading = asyncio.Lock()
        self._board = Board.create()
        self._cells = list(range(CELLS))

    # holding ----------------------------------------------------------------

    async def hold(self, name: str, *, triage: bool = False) -> Resident:
        """The model, made resident if it is not; held for the caller.
        `triage`: in the triage lane's worker."""
        check_name(name)
        at = key(name, triage)
        if at not in self.models:
            # The pause after recent crashes is waited out before taking
            # the lock, which other models' loads and keep-alive need.
            await self._admit(at)
        async with self.loading:
            resident = self.models.get(at)
            if resident is not None and resident.worker.alive:
                resident.hold()
                return resident
            self._refuse(at)
            resident = await self._load(name, triage)
            resident.hold()
            self.models[at] = resident
            logger.info("loaded %s (sha256 %s) in engine worker %d%s; placed: %s", at,
                        resident.digest, resident.worker.pid,
                        f", lease {resident.lease.lease_id} ({resident.need} bytes on "
                        f"{resident.lease.plane})" if resident.lease else ", unleased",
                        placed_line(resident.placement))
            if self._sweeper is None or self._sweeper.done():
                self._sweeper = asyncio.create_task(self._keep_alive())
            return resident

    def _refuse(self, name: str) -> None:
        """EngineFailing when `crash_limit` crashes fall within the window."""
        record = self.crashes.get(name)
        if record is None:
            return
        now = time.monotonic()
        while record.times and now - record.times[0] > self.config.crash_window:
            record.times.popleft()
        count = len(record.times)
        if self.config.crash_limit and count >= self.config.crash_limit:
            retry = record.times[0] + self.config.crash_window - now
            raise EngineFailing(model=name, crashes=count,
                                window_s=self.config.crash_window,
                                retry_after_s=round(max(0.0, retry), 1),
                                reason=record.last.describe() if record.last else "crashed")

    async def _admit(self, name: str) -> None:
        """Refuse the model, or wait out the pause after recent crashes."""
        self._refuse(name)
        record = self.crashes.get(name)
        if record is None:
            return
        now = time.monotonic()
        count = len(record.times)
        if count >= 2:
            pause = min(BACKOFF_MAX, BACKOFF * 2 ** (count - 2)) - (now - record.times[-1])
            if pause > 0:
                logger.info("waiting %.1f s before restarting the engine of %s", pause, name)
                await asyncio.sleep(pause)

    async def open_verified(self, name: str) -> tuple[int, str, int]:
        """modeld's descriptor, digest and size of `name`, its bytes checked."""
        from syntrop.interfaces import model as model_contract

        try:
            fd, digest, size = await open_in_modeld(self.socket, name, MODELD_TIMEOUT)
        except (model_contract.ModelNotFound, model_contract.InvalidIdentifier):
            raise ModelNotFound(model=name) from None
        except OSError as error:
            logger.warning("cannot reach modeld: %s", error)
            raise ModelNotFound(model=name) from None
        try:
            await asyncio.to_thread(verified, fd, digest)
        except WeightsDiffer as error:
            os.close(fd)
            raise WeightsMismatch(expected=error.expected, actual=error.actual) from None
        except BaseException:
            os.close(fd)
            raise
        return fd, digest, size

    async def _load(self, name: str, triage: bool) -> Resident:
        fd, digest, size = await self.open_verified(name)
        try:
            # The triage lane serves one request at a time: one context.
            slots = 1 if triage else self.config.slots
            metadata = await self._header(fd)
            need = leases.need_bytes(size, metadata, n_ctx=self.config.n_ctx, slots=slots)
            worker = await self._start(key(name, triage), slots)
            resident = Resident(name=name, digest=digest, size=size, worker=worker,
                                triage=triage, need=need)
            try:
                resident.cgroup = self.cgroups.place(worker.pid)
                resident.lease = await self._lease(resident)
                placed = self._place(resident, metadata, slots)
                loaded = await worker.request(
                    protocol.Load(name=name, digest=digest, placement=placed), [fd], label="load")
                resident.placement = loaded.get("placement")
            except BaseException:
                await worker.stop()
                self._let_go(resident)
                raise
        except WorkerGone as gone:
            # Counted as a crash (by `_exited`): a model that always
            # crashes its loader is not retried forever.
            raise crashed(name, gone) from None
        finally:
            os.close(fd)
        return resident

    async def _header(self, fd: int) -> dict[str, Any]:
        """The GGUF metadata of the model behind `fd` (empty when it has
        none: the engine says what is wrong with it, at load)."""
        from syntrop import modelfile

        try:
            info = await asyncio.to_thread(modelfile.read_fd, fd)
        except (modelfile.InvalidModel, OSError):
            return {}
        return dict(info.metadata)

    def _place(self, resident: Resident, metadata: dict[str, Any], slots: int) -> "Placed":
        """Where `resident`'s engine runs: its lease placed (placing.py)."""
        from syntrop.runtimed import placing
        from syntrop.runtimed.placement import Grant

        held = resident.lease
        return placing.for_lease(
            Grant.single(held.plane, held.memory) if held is not None else None, metadata,
            resident.size, n_ctx=self.config.n_ctx, slots=slots,
            planes=self.leases.planes if self.leases is not None else [])

    async def _lease(self, resident: Resident) -> leases.Held | None:
        """The lease of `resident`'s memory for its worker; when refused,
        idle models are unloaded and it is asked once more, then
        InsufficientMemory."""
        if self.leases is None:
            return None
        priority = leases.TRIAGE if resident.triage else leases.MAIN
        for attempt in (1, 2):
            try:
                return await self.leases.acquire(resident.worker.pid, resident.need, priority)
            except leases.Refused as refused:
                idle = [k for k, m in self.models.items()
                        if self.keep_alive_left(m, time.monotonic()) is not None]
                if attempt == 1 and refused.reason == "ResourceExhaustion" and idle:
                    await self.unload(idle, f"to make room for {resident.name}")
                    continue
                params = refused.params
                raise InsufficientMemory(
                    model=resident.name, plane=str(params.get("plane", "cpu")),
                    needed_bytes=resident.need, available_bytes=params.get("available"),
                    reason=refused.reason) from None
        raise AssertionError("unreachable")

    def _let_go(self, resident: Resident) -> None:
        """Release what a resident held outside its worker: its lease (in
        the background: this runs from callbacks too) and its cgroup."""
        self.cgroups.drop(resident.cgroup)
        resident.cgroup = None
        held, resident.lease = resident.lease, None
        if held is not None and self.leases is not None:
            task = asyncio.get_running_loop().create_task(self.leases.release(held))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _start(self, name: str, slots: int) -> WorkerProcess:
        choice = await self._engine()
        cell = self._cells.pop(0)
        Board.clear(self._board, cell)
        from syntrop.runtimed.cpu import plane_threads

        # Every core of the plane unless n_threads says fewer; the layout
        # shares them between concurrent generations step by step.
        cores = plane_threads()
        settings = {"layout": self.config.layout, "slots": slots,
                    "cpus": min(self.config.n_threads, cores) if self.config.n_threads else cores,
                    "instances": self.config.instances,
                    # The triage lane outweighs every other worker for the CPU.
                    "nice": 0 if lane_of(name)[1] else OTHERS_NICE}
        try:
            return await WorkerProcess.start(name, settings=settings, engine=choice.to_json(),
                                      board=self._board, cell=cell, on_exit=self._exited)
        except OSError:  # not started at all (no process to end)
            self._cells.append(cell)
            raise

    async def load_draft(self, resident: Resident, draft: str) -> None:
        """Put a draft model into `resident`'s worker, once."""
        check_name(draft, "sampling.speculative.draft")
        if draft in resident.drafts:
            return
        fd, _, _ = await self.open_verified(draft)
        try:
            await resident.worker.request(protocol.Draft(name=draft), [fd], label="draft")
        finally:
            os.close(fd)
        resident.drafts.add(draft)

    # leaving ----------------------------------------------------------------

    def report(self, now: float) -> list[EngineWorker]:
        """GetEngine's workers: every running one, and each model whose
        worker crashed within the crash window."""
        workers: list[EngineWorker] = []
        crashes = self.crashes
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
                cgroup=resident.cgroup if resident else None,
                placement=engine_placement(resident.placement) if resident else None))
        return workers

    def keep_alive_left(self, resident: Resident, now: float) -> float | None:
        """Seconds before `resident` is unloaded; None while it is in use."""
        idle = resident.idle_for(now)
        if idle is None or self.in_use(resident):
            return None
        return max(0.0, self.config.keep_alive - idle)

    async def _keep_alive(self) -> None:
        """Unload models idle past the keep-alive, or idle at all while memory
        is under pressure (then shed the rest too), until none is resident."""
        period = max(0.05, min(self.config.keep_alive / 4, 5.0))
        while self.models:
            await asyncio.sleep(period)
            pressed = self._memory_pressed()
            async with self.loading:
                now = time.monotonic()
                lefts = {name: self.keep_alive_left(resident, now)
                         for name, resident in self.models.items()}
                expired = [name for name, left in lefts.items()
                           if left == 0.0 or (pressed and left is not None)]
                await self.unload(expired, "under memory pressure" if pressed
                                  else "idle for its keep-alive")
            if pressed and self.on_pressure is not None:
                try:
                    await self.on_pressure()
                except Exception as error:  # the sweep goes on whatever failed
                    logger.warning("shedding under memory pressure failed: %s", error)

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

    async def unload(self, names: list[str], why: str) -> int:
        """Stop the workers of `names` (resident, idle: the caller checked
        under `loading`); bytes freed."""
        freed = 0
        for name in names:
            # Gone from GetLoad only once its worker (and so modeld's
            # descriptor) is: then modeld no longer counts it in use.
            resident = self.models[name]
            await resident.worker.stop()
            self._let_go(resident)
            self.models.pop(name, None)  # `_exited` may have taken it already
            freed += resident.size
            logger.info("unloaded %s: %s", name, why)
        return freed

    def _exited(self, worker: WorkerProcess, exit: Exit, calls: list[str]) -> None:
        Board.clear(self._board, worker.cell)
        self._cells.append(worker.cell)
        resident = self.models.get(worker.model)
        if resident is not None and resident.worker is worker:
            del self.models[worker.model]
            self._let_go(resident)
        if worker.expected:
            return
        serving = ", ".join(calls) if calls else "nothing"
        logger.error("the engine of %s (pid %d) %s while serving %s", worker.model, worker.pid,
                     exit.describe(), serving)
        self._count(worker.model, exit, calls)
        self.on_crash(worker, exit, calls)

    def _count(self, name: str, exit: Exit | None, calls: list[str]) -> None:
        record = self.crashes.setdefault(name, Crashes())
        record.times.append(time.monotonic())
        record.last, record.last_calls = exit, calls
        record.total += 1

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for name in list(self.models):
            resident = self.models.pop(name)
            await resident.worker.stop()
            self._let_go(resident)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        os.close(self._board)
