"""The Varlink face of inferenced: io.syntrop.Inference1.

Each method validates, checks who calls, has the lease keeping (leases.py)
decide, persist and apply (cgroup freezer, pid watches), then answers in
the contract's terms. State reaches SQLite before the reply. Where a lease
goes is placement.py's, pressure readings are pressure.py's, and what
modeld and runtimed say about models is models.py's; their refusals
become the contract's errors here.

Preemption: when an EmergencyTriage grant freezes leases, their cgroups are
frozen before the reply returns (the seed allows 250 ms; we wait for the
kernel's "frozen 1" event, bounded by that). The cgroup of a lease is its
unit's, else its pid's; the root cgroup and any cgroup containing inferenced
itself are never frozen. When no cgroup can be frozen the lease is still
frozen in the books, and the log says why. Nor is a cgroup frozen around a
process of another user than the lease's owner, unless the owner was root
or could name others' processes when granted: checked at the grant, and
again at every freeze (a process may enter the cgroup later); the owner's
Freeze is then NotAuthorized, preemption leaves that cgroup running.
"""

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

from asyncvarlink import FileDescriptor

from syntrop.config import Paths
from syntrop.inferenced import arbiter as arb
from syntrop.inferenced import models, placement
from syntrop.inferenced.config import Config, load
from syntrop.inferenced.leases import (
    ForeignProcess,
    Leases,
    LinuxHost,
    NoSuchProcess,
    Pending,
)
from syntrop.inferenced.pressure import Pressure
from syntrop.inferenced.store import Group, LeaseRecord, Model, Store
from syntrop.inferenced.topology import PlaneInfo, Topology, scan
from syntrop.interfaces.inference import (
    AcquireBufferResult,
    AcquireCompositeLeaseResult,
    AcquireLeaseResult,
    CompositeLease,
    ComputePlane,
    GetPressureResult,
    GetTopologyResult,
    Inference1,
    InvalidParameter,
    LeaseInfo,
    LeaseNotFound,
    ModelInfo,
    ModelNotFound,
    NotAuthorized,
    PlaneNotFound,
    PlaneQuarantined,
    PlaneSlice,
    PressureTooHigh,
    ResourceExhaustion,
    RuntimeUnavailable,
)
from syntrop.system import cgroup, process
from syntrop.varlink import authz, current_peer, implements

logger = logging.getLogger(__name__)

MAX_NAME = 256


def _check_name(value: str | None, parameter: str) -> None:
    if value is not None and (len(value) > MAX_NAME or "\0" in value):
        raise InvalidParameter(parameter=parameter)


def _inside(mount: Path, unit: str, named: str, pid: int, uid: int) -> bool:
    """Whether `unit` (cgroup `named`) is a service or scope that process
    `pid` runs in, holding only processes of `uid`: never what contains the
    caller from above (a slice holds other sessions)."""
    if not unit.endswith((".service", ".scope")):
        return False
    mine = cgroup.cgroup_of_pid(pid)
    if mine is None or not cgroup.contains(named, mine):
        return False
    return cgroup.uids_in(mount, named) <= {uid}


class InferenceService(Inference1):
    """Discovers compute planes and leases them by priority."""

    def __init__(self, paths: Paths, config: Config | None = None) -> None:
        self.paths = paths
        self.config = config or load(paths.configuration / "inferenced.toml")
        self.root = self.config.root
        self.topology: Topology = scan(self.root, self.config.topology)
        self.store = Store(paths.state / "inferenced.db")
        records, groups, models, quarantine = self.store.load()
        self.models = {m.id: m for m in models}
        self.quarantine = quarantine
        self.mount = cgroup.find_mount()
        self.leases = Leases(self.store, self._planes, LinuxHost(self.mount),
                             loaded=(records, groups))
        self.pressure = Pressure(self.root, self.config.thresholds)

    @classmethod
    async def open(cls, paths: Paths) -> "InferenceService":
        service = cls(paths)
        await service.restore()
        service.pressure.arm_trigger()
        return service

    # state -------------------------------------------------------------------

    def _planes(self) -> list[arb.Plane]:
        return [
            arb.Plane(
                id=p.id,
                total=p.total_memory,
                triage_reserve=p.triage_reserve,
                quarantined=self.quarantine.get(p.id),
            )
            for p in self.topology.planes
        ]

    def _rescan(self) -> None:
        self.topology = scan(self.root, self.config.topology)
        self.arbiter.planes = {p.id: p for p in self._planes()}

    async def restore(self) -> None:
        await self.leases.restore()

    # what the interface reads of the lease keeping
    @property
    def arbiter(self) -> arb.Arbiter:
        return self.leases.arbiter

    @property
    def records(self) -> dict[str, LeaseRecord]:
        return self.leases.records

    @property
    def lock(self) -> asyncio.Lock:
        return self.leases.lock

    def keep_alive(self) -> bool:
        """Stay up while leases need watching (their pids, their freezes)."""
        return bool(self.records)

    # who may claim what ------------------------------------------------------

    async def _check_claims(self, priority: str, unit: str | None, pid: int | None) -> bool:
        """A lease freezes the cgroup it names when preempted: a caller may
        name only itself, its own children, and a service or scope it runs
        in that holds no other user's processes; anything else (a slice, a
        unit around other users) needs lease-others. EmergencyTriage
        preempts everyone and is authorized apart. A unit with no cgroup
        is refused outright: it would freeze whatever took its name later.
        Whether the caller may name others' processes (root, or granted
        lease-others): if not, each freeze of the lease checks its cgroup's
        users again (leases.foreign_uid)."""
        peer = current_peer()
        if priority == "EmergencyTriage" and not self._emergency_unit(peer.pid):
            await authz.authorize(authz.EMERGENCY, NotAuthorized)
        named = None
        if unit and self.mount is not None:
            named = cgroup.unit_cgroup(self.mount, unit)
            if named is None:
                raise InvalidParameter(parameter="unit")
        if authz.privileged(peer):
            return True
        own = pid is None or process.descends_from(pid, peer.pid)
        if own and unit and self.mount is not None and named is not None:
            own = _inside(self.mount, unit, named, peer.pid, peer.uid)
        if own:
            return False
        await authz.authorize(authz.LEASE_OTHERS, NotAuthorized)
        return True

    def _emergency_unit(self, pid: int) -> bool:
        """Whether `pid` runs in one of the units configured to take
        EmergencyTriage leases (runtimed's triage lane), by its cgroup."""
        if self.mount is None or not pid:
            return False
        mine = cgroup.cgroup_of_pid(pid)
        for unit in self.config.emergency_units:
            named = cgroup.unit_cgroup(self.mount, unit)
            if named is not None and mine is not None and cgroup.contains(named, mine):
                return True
        return False

    # the core of acquire and release -----------------------------------------

    def _pressure_gate(self, priority: str) -> None:
        refused = self.pressure.refuses(priority)
        if refused is not None:
            level, resource = refused
            raise PressureTooHigh(resource=resource, level=level, priority=priority)

    def _grant(
        self,
        requests: list[tuple[str, int]],
        *,
        priority: str,
        unit: str | None,
        pid: int | None,
        group: Group | None = None,
        slices: list[PlaneSlice] | None = None,
        exclusive: bool = False,
        for_others: bool = False,
    ) -> tuple[list[arb.Lease], Pending]:
        """Decide a grant (the lock held) and queue its write, in the
        contract's errors; `self.leases.settle` finishes it."""
        peer = current_peer()
        if pid is None:
            pid = peer.pid or None
        self._pressure_gate(priority)
        try:
            return self.leases.grant(
                requests, priority=priority, owner_uid=peer.uid, leaser_pid=peer.pid,
                unit=unit, pid=pid, group=group, exclusive=exclusive, for_others=for_others,
                slices=[(s.role, s.stage_index) for s in slices] if slices else None)
        except NoSuchProcess:
            raise InvalidParameter(parameter="pid") from None
        except arb.PlaneUnknown as error:
            raise PlaneNotFound(plane=error.plane) from None
        except arb.PlaneInQuarantine as error:
            raise PlaneQuarantined(plane=error.plane, reason=error.reason) from None
        except arb.Exhausted as error:
            raise ResourceExhaustion(
                plane=error.plane, requested=error.requested, available=error.available
            ) from None
        except arb.InvalidPriority:
            raise InvalidParameter(parameter="priority") from None
        except arb.InvalidMemory:
            raise InvalidParameter(parameter="memory_bytes") from None
        except arb.ArbiterError:
            raise InvalidParameter(parameter="slices") from None

    def _release(self, lease_id: str) -> Pending:
        try:
            return self.leases.release(lease_id)
        except arb.LeaseUnknown:
            raise LeaseNotFound(lease_id=lease_id) from None

    def _lease_or_gang(self, lease_id: str) -> LeaseRecord:
        record = self.leases.lease_or_gang(lease_id)
        if record is None:
            raise LeaseNotFound(lease_id=lease_id)
        return record

    async def _owned(self, lease_id: str) -> LeaseRecord:
        """The lease, when the caller owns it or may act for others.
        Checked outside the lock: a polkit question must not hold it."""
        record = self._lease_or_gang(lease_id)
        await authz.authorize(authz.LEASE_OTHERS, NotAuthorized,
                              owner_uid=record.lease.owner_uid)
        return record

    # the interface -------------------------------------------------------------

    @implements
    def GetTopology(self) -> GetTopologyResult:
        self._rescan()
        planes = [self._plane(p) for p in self.topology.planes]
        return {
            "planes": planes,
            "total_ram": self.topology.total_ram,
            "available_ram": self.topology.available_ram,
            "cpu_cores": self.topology.cpu_cores,
        }

    def _plane(self, p: PlaneInfo) -> ComputePlane:
        free_on_device = max(0, p.total_memory - p.used_memory)
        available = max(0, free_on_device - self.arbiter.held(p.id))
        return ComputePlane(
            id=p.id, name=p.name, kind=p.kind, total_memory=p.total_memory,
            available_memory=available, is_triage_reserved=p.triage_reserve > 0,
            quarantined=self.quarantine.get(p.id),
        )

    @implements
    def GetPressure(self) -> GetPressureResult:
        readings = self.pressure.readings()
        level, _ = self.pressure.level()
        return {
            "level": level,
            "cpu_some": readings["cpu"],
            "memory_some": readings["memory"],
            "io_some": readings["io"],
        }

    @implements
    async def AcquireLease(
        self,
        *,
        priority: str,
        memory_bytes: int,
        plane: str | None,
        unit: str | None,
        pid: int | None,
        exclusive: bool | None = None,
    ) -> AcquireLeaseResult:
        _check_name(unit, "unit")
        if priority not in arb.PRIORITIES:
            raise InvalidParameter(parameter="priority")
        if exclusive and priority != arb.EMERGENCY:
            raise InvalidParameter(parameter="exclusive")
        if not 0 < memory_bytes <= arb.MAX_LEASE_BYTES:
            raise InvalidParameter(parameter="memory_bytes")
        if pid is not None and pid <= 0:
            raise InvalidParameter(parameter="pid")
        for_others = await self._check_claims(priority, unit, pid)
        async with self.lock:
            if plane is not None and plane not in self.arbiter.planes:
                self._rescan()  # a device plugged in since the last scan
            target = plane if plane is not None else self._best_plane(priority, memory_bytes)
            (lease,), pending = self._grant(
                [(target, memory_bytes)], priority=priority, unit=unit, pid=pid,
                exclusive=bool(exclusive), for_others=for_others,
            )
        # Outside the lock: grants decided meanwhile share this commit.
        await self.leases.settle(pending)
        return {"lease_id": lease.id, "plane_id": lease.plane, "allocated_memory": lease.memory}

    def _best_plane(self, priority: str, memory: int) -> str:
        """Where a lease naming no plane goes (placement.best_plane)."""
        try:
            return placement.best_plane(self.topology, self.quarantine, self.arbiter,
                                        priority, memory)
        except arb.Exhausted as error:
            raise ResourceExhaustion(
                plane=error.plane, requested=error.requested, available=error.available
            ) from None

    @implements
    async def AcquireCompositeLease(
        self,
        *,
        gang_id: str,
        slices: list[PlaneSlice],
        gang_policy: str,
        priority: str,
        client_unit: str | None,
    ) -> AcquireCompositeLeaseResult:
        _check_name(gang_id, "gang_id")
        _check_name(client_unit, "client_unit")
        if gang_policy != "all-or-nothing":
            raise InvalidParameter(parameter="gang_policy")
        if priority not in arb.PRIORITIES:
            raise InvalidParameter(parameter="priority")
        if not slices or len(slices) > 64:
            raise InvalidParameter(parameter="slices")
        if any(s.role not in ("pipeline", "tensor") for s in slices):
            raise InvalidParameter(parameter="slices")
        if any(not 0 < s.memory_bytes <= arb.MAX_LEASE_BYTES for s in slices):
            raise InvalidParameter(parameter="slices")
        for_others = await self._check_claims(priority, client_unit, None)
        named = [s.plane_id for s in slices if s.plane_id]
        if len(set(named)) != len(named):
            raise InvalidParameter(parameter="slices")
        async with self.lock:
            placed = self._place(slices, priority)
            group = Group(id=f"gang-{os.urandom(6).hex()}", gang_id=gang_id,
                          gang_policy=gang_policy)
            leases, pending = self._grant(
                [(s.plane_id, s.memory_bytes) for s in placed], priority=priority,
                unit=client_unit, pid=None, group=group, slices=placed,
                for_others=for_others,
            )
        await self.leases.settle(pending)
        return {
            "lease_id": group.id,
            "allocated_slices": [
                replace(s, plane_id=lease.plane) for s, lease in zip(placed, leases, strict=True)
            ],
        }

    def _place(self, slices: list[PlaneSlice], priority: str) -> list[PlaneSlice]:
        """Planes for a gang's open slices (placement.place)."""
        try:
            return placement.place(slices, self.topology, self.quarantine, self.arbiter,
                                   priority)
        except arb.Exhausted as error:
            raise ResourceExhaustion(
                plane=error.plane, requested=error.requested, available=error.available
            ) from None

    @implements
    async def ReleaseLease(self, *, lease_id: str) -> None:
        await self._owned(lease_id)
        async with self.lock:
            pending = self._release(self._lease_or_gang(lease_id).lease.id)
        await self.leases.settle(pending)

    @implements
    async def Yield(self, *, lease_id: str) -> None:
        await self.ReleaseLease(lease_id=lease_id)

    async def _set_frozen(self, lease_id: str, frozen: bool) -> None:
        await self._owned(lease_id)
        try:
            await self.leases.set_frozen(lease_id, frozen)
        except arb.LeaseUnknown:
            raise LeaseNotFound(lease_id=lease_id) from None  # released meanwhile
        except ForeignProcess as error:
            # Its owner may not freeze another user's process that entered
            # the lease's cgroup after the grant (so neither may anyone
            # through the lease).
            logger.warning("lease %s: not frozen, its cgroup holds a process of uid %d",
                           lease_id, error.uid)
            raise NotAuthorized(action=authz.LEASE_OTHERS) from None
        except arb.Exhausted as error:
            raise ResourceExhaustion(
                plane=error.plane, requested=error.requested, available=error.available
            ) from None

    @implements
    async def Freeze(self, *, lease_id: str) -> None:
        await self._set_frozen(lease_id, True)

    @implements
    async def Thaw(self, *, lease_id: str) -> None:
        await self._set_frozen(lease_id, False)

    @implements
    def ListLeases(self) -> list[LeaseInfo]:
        return [
            LeaseInfo(
                id=r.lease.id, plane_id=r.lease.plane, allocated_memory=r.lease.memory,
                priority=r.lease.priority, state=r.lease.state, client_unit=r.lease.unit,
                client_pid=r.lease.pid, exclusive=r.lease.exclusive or None,
            )
            for r in sorted(self.records.values(), key=lambda r: r.lease.seq)
            if r.lease.group is None
        ]

    @implements
    def ListCompositeLeases(self) -> list[CompositeLease]:
        out = []
        for group in self.leases.groups.values():
            members = sorted(
                (r for r in self.records.values() if r.lease.group == group.id),
                key=lambda r: r.lease.seq,
            )
            out.append(
                CompositeLease(
                    lease_id=group.id, gang_id=group.gang_id, gang_policy=group.gang_policy,
                    slices=[
                        PlaneSlice(plane_id=r.lease.plane, role=r.role or "tensor",
                                   stage_index=r.stage_index, memory_bytes=r.lease.memory)
                        for r in members
                    ],
                )
            )
        return out

    @implements
    async def ListModels(self) -> list[ModelInfo]:
        """The models registered here, then those only modeld holds (by
        name[:tag], their weights' size, "modeld" as their path)."""
        known = [(m.id, m.format, m.path, m.estimated_bytes) for m in self.models.values()]
        stored = await models.stored(self.paths)
        known += [(name, "gguf", "modeld", size) for name, size in sorted(stored.items())
                  if name not in self.models]
        return [
            ModelInfo(
                id=name, format=format, path=path, estimated_memory=size,
                placement=placement.fitting(self.topology, self.quarantine, self.arbiter, size),
            )
            for name, format, path, size in known
        ]

    @implements
    async def RegisterModel(self, *, id: str, format: str, path: str, estimated_bytes: int) -> None:
        if not id or len(id) > MAX_NAME or "\0" in id or "/" in id:
            raise InvalidParameter(parameter="id")
        if not format or len(format) > 32:
            raise InvalidParameter(parameter="format")
        if not path or len(path) > 4096 or "\0" in path:
            raise InvalidParameter(parameter="path")
        if not 0 < estimated_bytes <= arb.MAX_LEASE_BYTES:
            raise InvalidParameter(parameter="estimated_bytes")
        # A model record steers placement and StreamInference for everyone.
        await authz.authorize(authz.MANAGE_MODELS, NotAuthorized)
        model = Model(id=id, format=format, path=path, estimated_bytes=estimated_bytes)
        await self.store.put_model(model)
        self.models[id] = model

    @implements
    async def StreamInference(self, *, model: str, prompt: str) -> AsyncIterator[str]:
        """Under an Interactive lease sized to the model (registered here,
        or its weights as modeld stores them), on the plane its placement
        names: the prompt as a user's message under the model's chat
        template, through runtimed's Chat with the model's defaults, and
        the answer's text relayed."""
        if len(prompt) > 1 << 20:
            raise InvalidParameter(parameter="prompt")
        registered = self.models.get(model)
        size = registered.estimated_bytes if registered is not None else \
            (await models.stored(self.paths)).get(model)
        if size is None:
            raise ModelNotFound(model=model)
        async with self.lock:
            plane = self._best_plane("Interactive", size)
            (lease,), pending = self._grant(
                [(plane, size)], priority="Interactive", unit=None, pid=None,
            )
        await self.leases.settle(pending)
        try:
            async for text in models.complete(self.paths, model, prompt):
                yield text
        except models.Unavailable as error:
            raise RuntimeUnavailable(reason=str(error)) from None
        finally:
            async with self.lock:
                released = self._release(lease.id) if lease.id in self.arbiter.leases \
                    else None
            if released is not None:
                await self.leases.settle(released)

    @implements
    async def AcquireBuffer(self, *, lease_id: str) -> AcquireBufferResult:
        record = await self._owned(lease_id)
        if lease_id not in self.records:
            raise LeaseNotFound(lease_id=lease_id)
        if record.lease.plane != "cpu":
            raise InvalidParameter(parameter="lease_id")
        fd = self.leases.buffers.get(lease_id)
        if fd is None:
            fd = os.memfd_create(f"syntrop-{lease_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, record.lease.memory)
            import fcntl

            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.leases.buffers[lease_id] = fd
        # The reply owns (and closes) a duplicate; the lease keeps the original.
        return {"buffer": FileDescriptor(os.dup(fd), should_close=True),
                "size": record.lease.memory}

    @implements
    async def Quarantine(self, *, plane: str, reason: str) -> None:
        await authz.authorize(authz.MANAGE_PLANES, NotAuthorized)
        if self.topology.plane(plane) is None:
            raise PlaneNotFound(plane=plane)
        if not reason or len(reason) > 1024:
            raise InvalidParameter(parameter="reason")
        await self.store.set_quarantine(plane, reason)
        self.quarantine[plane] = reason
        self.arbiter.planes[plane] = replace(self.arbiter.planes[plane], quarantined=reason)

    @implements
    async def Unquarantine(self, *, plane: str) -> None:
        await authz.authorize(authz.MANAGE_PLANES, NotAuthorized)
        if self.topology.plane(plane) is None:
            raise PlaneNotFound(plane=plane)
        await self.store.set_quarantine(plane, None)
        self.quarantine.pop(plane, None)
        self.arbiter.planes[plane] = replace(self.arbiter.planes[plane], quarantined=None)

    async def aclose(self) -> None:
        self.pressure.close()
        self.leases.close()
        self.store.close()

