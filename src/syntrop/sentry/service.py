"""The Varlink face of systemd-sentry: io.syntrop.Sentry1.

Start-up (`SentryService.create`): config, store, then the system bus:
subscribe to JobRemoved and unit PropertiesChanged *before* the daemon says
READY=1 (the daemon helper sends it once this returns). Without a system bus
sentry still serves Sentry1, says subscribed=false and state degraded, and
manual Triage still runs (every phase that needs systemd fails fast and the
incident records it).
"""

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

from syntrop.config import Paths
from syntrop.interfaces.sentry import (
    Breaker,
    BreakerOpen,
    Cause,
    Episode,
    Incident,
    IncidentNotFound,
    InvalidUnitName,
    NotAuthorized,
    Phase,
    PlanStep,
    Sentry1,
    StatusResult,
    UnitIgnored,
)
from syntrop.sentry import breaker
from syntrop.sentry.config import Config, load
from syntrop.sentry.phases import Live
from syntrop.sentry.pipeline import IncidentRecord, wall_clock_usec
from syntrop.sentry.store import Store
from syntrop.sentry.supervisor import Signal, Supervisor
from syntrop.system import systemd as sd
from syntrop.system.notify import notify
from syntrop.varlink import InvalidParameter, authz, implements

logger = logging.getLogger(__name__)

BUS_TIMEOUT = 2.0
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
FAILED_RESULTS = {"failed": "job_failed", "timeout": "job_timeout",
                  "dependency": "job_dependency"}
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]+\.(service|socket|target|device|mount|automount|"
                   r"swap|timer|path|slice|scope)")


def valid_unit_name(unit: str) -> bool:
    return len(unit) <= 255 and _UNIT.fullmatch(unit) is not None


def _wire(record: IncidentRecord) -> Incident:
    cause = record.cause
    return Incident(
        id=record.id, unit=record.unit, detected_usec=record.detected_usec,
        trigger=record.trigger, decision=record.decision, decided_by=record.decided_by,
        result=record.result, summary=record.summary,
        phases=[Phase(name=p.name, started_usec=p.started_usec,
                      duration_usec=p.duration_usec, budget_usec=p.budget_usec,
                      outcome=p.outcome, detail=p.detail) for p in record.phases],
        cause=None if cause is None else Cause(
            kind=cause.kind, fixable=cause.fixable, summary=cause.summary,
            subject=cause.subject, package=cause.package, evidence=list(cause.evidence)),
        plan=[PlanStep(tool=s.tool, parameters=json.dumps(s.parameters, sort_keys=True),
                       outcome=s.outcome, message=s.message) for s in record.plan],
        findings=list(record.findings))


class SentryService(Sentry1):
    """Watches systemd and drives the triage loop."""

    def __init__(self, paths: Paths, *, config: Config | None = None,
                 systemd: sd.Systemd | None = None) -> None:
        self.paths = paths
        self.config = config if config is not None else load(paths.configuration)
        self.store = Store(paths.state / "sentry.sqlite")
        self.systemd = systemd
        self.slots: list[Any] = []
        #: Each unit's last ActiveState seen: systemd sends PropertiesChanged
        #: again while a unit stays failed (its Result, its timestamps), and
        #: only the change into failed is a failure.
        self.states: dict[str, str] = {}
        self.clock = wall_clock_usec
        live = Live(systemd=systemd, model=self.config.model,
                    window_usec=self.config.recent_usec, sysfs_root=self.config.sysfs_root,
                    warm=self.config.warm_session)
        self.live = live
        self.supervisor = Supervisor(self.store, live.phases(), self.config, self.clock,
                                     on_change=self._status, still_failed=live.still_failed,
                                     start_lost=live.start_dependent, changed=live.changed)
        self.supervisor.start()

    @classmethod
    async def create(cls, paths: Paths) -> "SentryService":
        systemd: sd.Systemd | None = None
        try:
            systemd = await asyncio.wait_for(sd.Systemd.open(), BUS_TIMEOUT)
        except (sd.SystemdError, TimeoutError) as error:
            logger.warning("no system bus (%s): not watching systemd, ignoring", error)
        service = cls(paths, systemd=systemd)
        interrupted = await service.store.interrupted()
        if interrupted:
            logger.warning("%d incidents were left in progress by a sentry that stopped "
                           "mid-triage: closed as interrupted", interrupted)
        if systemd is not None:
            try:
                service.slots = await sd.watch_units(systemd, service._job, service._state)
            except sd.SystemdError as error:
                logger.warning("cannot subscribe to systemd (%s), ignoring", error)
        service._status()
        if service.live.warm is not None:
            # In the background: the first reply does not wait for the model.
            service.live.warm.start()
        return service

    @property
    def subscribed(self) -> bool:
        return bool(self.slots)

    def keep_alive(self) -> bool:
        return self.supervisor.triaging > 0 or not self.supervisor.queue.empty()

    async def aclose(self) -> None:
        for slot in self.slots:
            slot.close()
        await self.supervisor.close()
        if self.live.warm is not None:
            await self.live.warm.close()
        if self.systemd is not None:
            self.systemd.close()
        self.store.close()

    # signals (called from the bus; never block) ---------------------------------

    def _job(self, job: sd.JobResult) -> None:
        trigger = FAILED_RESULTS.get(job.result)
        if trigger is not None:
            self.supervisor.offer(Signal(unit=job.unit, trigger=trigger,
                                         detected_usec=self.clock()))

    def _state(self, unit: str, active_state: str) -> None:
        # A running service that crashes makes no job: only this says so. A
        # failed job also ends here; the supervisor keeps one pending per unit.
        before = self.states.get(unit)
        self.states[unit] = active_state
        if active_state == "failed" and before != "failed":
            self.supervisor.offer(Signal(unit=unit, trigger="state_failed",
                                         detected_usec=self.clock()))

    def _status(self) -> None:
        open_ = self.supervisor.triaging + self.supervisor.queue.qsize()
        watching = "watching systemd" if self.subscribed else "not watching systemd"
        notify(f"STATUS={open_} open incidents, {watching}")

    # the face ----------------------------------------------------------------------

    @implements
    async def GetStatus(self) -> StatusResult:
        open_, total = await self.store.counts()
        now = self.clock()
        breakers = []
        for state in await self.store.breakers():
            verdict = breaker.check(state, now, self.config.policy)
            if verdict.state != "closed":
                breakers.append(Breaker(unit=state.unit, state=verdict.state,
                                        attempts=state.attempts,
                                        open_until_usec=verdict.open_until_usec or None))
        if not self.subscribed:
            status = "degraded"
        elif self.supervisor.triaging:
            status = "triaging"
        else:
            status = "watching"
        warm = self.live.warm
        with contextlib.suppress(Exception):  # NoTriageModel: said below as null
            await self.live.triage_model()
        window = self.config.policy.window_usec
        episodes = [Episode(unit=e.unit, since_usec=e.since_usec, triages=e.triages,
                            results=list(e.results),
                            waiting_for=f"a start, a change in contextd, or "
                                        f"{max(0, e.since_usec + window - now) // 1_000_000} s "
                                        "(the breaker's window)")
                    for e in self.supervisor.open_episodes()]
        return StatusResult(state=status, subscribed=self.subscribed, open_incidents=open_,
                            incidents_total=total, breakers=breakers,
                            triage_session=warm.describe() if warm is not None else None,
                            episodes=episodes, triage_model=self.live.chosen or None)

    @implements
    async def ListIncidents(self, *, limit: int | None = None,
                            unit: str | None = None) -> list[Incident]:
        if limit is not None and not 0 <= limit <= MAX_LIMIT:
            raise InvalidParameter(parameter="limit")
        if unit is not None and not valid_unit_name(unit):
            raise InvalidParameter(parameter="unit")
        records = await self.store.incidents(
            limit=DEFAULT_LIMIT if limit is None else limit, unit=unit)
        return [_wire(r) for r in records]

    @implements
    async def GetIncident(self, *, id: str) -> Incident:
        record = await self.store.incident(id) if len(id) <= 64 else None
        if record is None:
            raise IncidentNotFound(id=id[:64])
        return _wire(record)

    @implements
    async def Triage(self, *, unit: str) -> Incident:
        if not valid_unit_name(unit):
            raise InvalidUnitName(unit=unit[:256])
        # sentry acts as root (toold's plans, EmergencyTriage leases).
        await authz.authorize(authz.TRIAGE, NotAuthorized)
        if self.config.ignored(unit):
            raise UnitIgnored(unit=unit)
        verdict = breaker.check(await self.store.breaker(unit), self.clock(),
                                self.config.policy)
        if not verdict.allowed:
            raise BreakerOpen(unit=unit, open_until_usec=verdict.open_until_usec)
        record = await self.supervisor.triage(unit, "manual", self.clock())
        return _wire(record)

    @implements
    async def ResetBreaker(self, *, unit: str) -> None:
        if not valid_unit_name(unit):
            raise InvalidUnitName(unit=unit[:256])
        await authz.authorize(authz.TRIAGE, NotAuthorized)
        await self.store.reset_breaker(unit)
        await self.store.forget_tried(unit)
