"""The supervisor: failure signals in, incidents out.

Design note: signals arrive from the D-Bus callback and must never block
it, so `offer()` is a put_nowait into a bounded queue (a full queue drops
the signal and counts it). One consumer task triages one unit at a time, in
arrival order; a unit already queued or being triaged is not queued twice.
The breaker is consulted before each triage and charged after every one,
whatever it decided (leaving a unit alone is a triage too: a model's call
and a lease), persisted with the incident, before anyone can read either.

One incident per failure episode: a unit that stays failed after a triage
that did not heal it (left alone, or a plan that did not hold) is not
triaged again until something changes — it is started again (a new job
makes its own signal), contextd records a change for it, or the breaker's
window since the episode began has passed. The supervisor looks every
`look_usec` (`changed`, `still_failed`); GetStatus shows the open episodes. A protected
unit gets an incident that says so and nothing else. A cause out of the
tools' reach that what was due did not heal marks the unit for a human at
once. A unit whose start was lost
to a failed dependency waits for that dependency's triage; once it heals,
the unit's start is retried (trigger dependency_healed).
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from syntrop.sentry import breaker
from syntrop.sentry.config import Config
from syntrop.sentry.pipeline import IncidentRecord, PhaseRecord, Phases, Policy, new_id, triage
from syntrop.sentry.store import Store

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Signal:
    unit: str
    trigger: str
    detected_usec: int


@dataclass(slots=True, kw_only=True)
class Episode:
    """A unit that stayed failed after its triage: when the episode began,
    its triages so far, and since when a change would be new."""

    unit: str
    since_usec: int
    triages: int = 1
    last_usec: int = 0
    results: list[str] = field(default_factory=list)


class Supervisor:
    def __init__(self, store: Store, phases: Phases, config: Config,
                 clock: Callable[[], int],
                 on_change: Callable[[], None] | None = None,
                 still_failed: Callable[[str], Awaitable[bool]] | None = None,
                 start_lost: Callable[[str], Awaitable[bool]] | None = None,
                 changed: Callable[[str, int], Awaitable[bool]] | None = None) -> None:
        self.store = store
        self.phases = phases
        self.config = config
        self.clock = clock
        self.on_change = on_change or (lambda: None)
        self.queue: asyncio.Queue[Signal] = asyncio.Queue(config.queue)
        self.pending: set[str] = set()
        self.dropped = 0
        self.triaging = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        #: Asked at each look at an open episode: is the unit still failed?
        #: (None: no episodes are kept; a unit that stays failed makes no
        #: new signal.) And has it started, or did contextd record a change
        #: for it, since a time (None: only the window reopens it)?
        self.still_failed = still_failed
        self.changed = changed
        self.episodes: dict[str, Episode] = {}
        #: How often an open episode is looked at.
        self.look_usec = max(config.policy.base_usec, 50_000)
        self._retries: dict[str, asyncio.TimerHandle] = {}
        #: Asked once a dependency healed: is the unit still waiting for
        #: the start it lost? Units waiting, by the dependency they wait for.
        self.start_lost = start_lost
        self.waiting: dict[str, set[str]] = {}
        # The memory of each unit's last run that went well and of the plans
        # that did not heal it (within the breaker's window) is the store's:
        # it outlives sentry's restarts.
        self._checks: set[asyncio.Task[None]] = set()
        #: Set when a signal was taken off the queue (for benches: the
        #: moment triage starts).
        self.started: Callable[[Signal], None] = lambda _: None

    def offer(self, signal: Signal) -> bool:
        """Queue a failure for triage, without waiting. False when ignored,
        already pending, or the queue is full."""
        if self.config.ignored(signal.unit) or signal.unit in self.pending:
            return False
        try:
            self.queue.put_nowait(signal)
        except asyncio.QueueFull:
            self.dropped += 1
            logger.warning("triage queue full, dropping %s, ignoring", signal.unit)
            return False
        self.pending.add(signal.unit)
        return True

    def start(self) -> None:
        self._task = asyncio.create_task(self._consume())

    async def close(self) -> None:
        for handle in self._retries.values():
            handle.cancel()
        self._retries.clear()
        for check in list(self._checks):
            check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await check
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _consume(self) -> None:
        while True:
            signal = await self.queue.get()
            self.started(signal)
            try:
                incident = await self.triage(signal.unit, signal.trigger,
                                             signal.detected_usec)
            except Exception:
                logger.exception("triage of %s failed", signal.unit)
            else:
                await self._after(incident)
            finally:
                self.pending.discard(signal.unit)

    async def _after(self, incident: IncidentRecord) -> None:
        """What an incident leads to: a dependency triaged, dependents'
        starts retried, a backoff retry."""
        unit = incident.unit
        if incident.result == "waiting" and incident.cause is not None \
                and incident.cause.subject:
            dependency = incident.cause.subject
            self.waiting.setdefault(dependency, set()).add(unit)
            # Its own failure signal usually came first; if not, triage it.
            self.offer(Signal(unit=dependency, trigger="dependency_of",
                              detected_usec=self.clock()))
            return
        if incident.result == "healed":
            self.episodes.pop(unit, None)
            for dependent in sorted(self.waiting.pop(unit, set())):
                await self._retry_dependent(dependent)
            return
        if incident.result in ("protected", "needs_human"):
            self.episodes.pop(unit, None)
            return
        self._episode(incident)

    def _episode(self, incident: IncidentRecord) -> None:
        """Open (or continue) the unit's episode and look at it later."""
        if self.still_failed is None:
            return
        now = self.clock()
        episode = self.episodes.get(incident.unit)
        if episode is None:
            episode = self.episodes[incident.unit] = Episode(
                unit=incident.unit, since_usec=incident.detected_usec, triages=0)
        episode.triages += 1
        episode.last_usec = now
        episode.results.append(incident.result)
        self._look_later(incident.unit, self.look_usec)

    async def _retry_dependent(self, unit: str) -> None:
        if self.start_lost is None:
            return
        try:
            lost = await self.start_lost(unit)
        except Exception as error:
            logger.info("cannot tell whether %s still waits (%s), ignoring", unit, error)
            return
        if lost:
            self.offer(Signal(unit=unit, trigger="dependency_healed",
                              detected_usec=self.clock()))

    def _look_later(self, unit: str, delay_usec: int) -> None:
        if unit in self._retries:
            return
        loop = asyncio.get_running_loop()
        self._retries[unit] = loop.call_later(delay_usec / 1e6, self._look, unit)

    def _look(self, unit: str) -> None:
        self._retries.pop(unit, None)
        task = asyncio.create_task(self._look_at(unit))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _look_at(self, unit: str) -> None:
        """An open episode: over when the unit is no longer failed; triaged
        again when something changed or the window since it began passed
        (and the breaker lets an attempt through); else looked at later."""
        episode = self.episodes.get(unit)
        if episode is None or self.still_failed is None:
            return
        try:
            failed = await self.still_failed(unit)
            changed = failed and self.changed is not None \
                and await self.changed(unit, episode.last_usec)
        except Exception as error:
            logger.info("cannot look at %s (%s), looking again later", unit, error)
            self._look_later(unit, self.look_usec)
            return
        if not failed:
            self.episodes.pop(unit, None)
            return
        now = self.clock()
        policy = self.config.policy
        window = now - episode.since_usec >= policy.window_usec
        if changed or window:
            verdict = breaker.check(await self.store.breaker(unit), now, policy)
            if verdict.state == "needs_human":
                self.episodes.pop(unit, None)
                return
            if verdict.allowed:
                if window:
                    episode.since_usec = now
                self.offer(Signal(unit=unit, trigger="changed" if changed else "episode_window",
                                  detected_usec=now))
                return
            self._look_later(unit, max(verdict.open_until_usec - now, self.look_usec))
            return
        self._look_later(unit, self.look_usec)

    def open_episodes(self) -> list[Episode]:
        """Units that stayed failed after their triage, waiting for a change."""
        return sorted(self.episodes.values(), key=lambda e: e.since_usec)

    async def triage(self, unit: str, trigger: str, detected_usec: int) -> IncidentRecord:
        """Triage one unit now: breaker, pipeline, persistence."""
        async with self._lock:
            self.triaging += 1
            self.on_change()
            try:
                return await self._triage(unit, trigger, detected_usec)
            finally:
                self.triaging -= 1
                self.on_change()

    async def _triage(self, unit: str, trigger: str, detected_usec: int) -> IncidentRecord:
        policy = self.config.policy
        now = self.clock()
        if self.config.is_protected(unit):
            incident = _protected(unit, trigger, detected_usec, now)
            await self.store.put_incident(incident)
            logger.info("%s", incident.summary)
            return incident
        state = await self.store.breaker(unit)
        verdict = breaker.check(state, now, policy)
        if not verdict.allowed:
            await self.store.put_breaker(breaker.record_refused(state, now, policy))
            incident = await triage(unit, trigger, phases=self.phases,
                                    budgets=self.config.budgets, clock=self.clock,
                                    detected_usec=detected_usec, breaker_open=True)
            await self.store.put_incident(incident)
            return incident
        attempts = breaker.attempts_in_window(state, now, policy)  # for the rules
        ident = new_id()
        await self.store.put_incident(IncidentRecord(
            id=ident, unit=unit, detected_usec=detected_usec, trigger=trigger,
            decision=None, decided_by=None, result="in_progress", phases=[],
            summary=f"{unit}: {trigger}; triage in progress"))
        incident = await triage(
            unit, trigger, phases=self.phases, budgets=self.config.budgets, clock=self.clock,
            detected_usec=detected_usec, incident_id=ident,
            policy=Policy(attempts=attempts, hold_min_usec=self.config.verify_usec,
                          hold_max_usec=self.config.verify_max_usec,
                          ran_well_usec=await self.store.ran_well(unit),
                          tried=await self.store.tried(unit, now - policy.window_usec + 1)))
        if incident.ran_well_usec:
            await self.store.put_ran_well(unit, incident.ran_well_usec)
        await self._remember(unit, incident, now)
        # Every triage is an attempt, whatever it decided: a decision to
        # leave a unit alone asked the model too, and must slow down as well.
        # Only waiting for a failed dependency is not (that one's triage
        # acts, and its healing retries this unit's start).
        if incident.result != "waiting":
            state = breaker.record_attempt(state, now, policy)
        if incident.result == "needs_human":
            state = breaker.record_out_of_reach(state)
        await self.store.put_breaker(state)
        await self.store.put_incident(incident)
        logger.info("%s", incident.summary)
        return incident

    async def _remember(self, unit: str, incident: IncidentRecord, now: int) -> None:
        """The plans that ran and did not heal (a restart too: with no
        backoff retries, one that did not hold is not repeated in the
        window; a change opens a new finding and its plan)."""
        if incident.result == "healed":
            await self.store.forget_tried(unit)
            return
        for described in incident.tried:
            await self.store.put_tried(unit, described, now)


def _protected(unit: str, trigger: str, detected_usec: int, now: int) -> IncidentRecord:
    phases = [PhaseRecord(name=name, started_usec=now, duration_usec=0, budget_usec=0,
                          outcome="skipped", detail="protected unit")
              for name in ("context", "lease", "decide", "execute", "verify", "release")]
    return IncidentRecord(
        id=new_id(), unit=unit, detected_usec=detected_usec, trigger=trigger, decision=None,
        decided_by=None, result="protected", phases=phases,
        summary=f"{unit}: {trigger}; protected: no action")
