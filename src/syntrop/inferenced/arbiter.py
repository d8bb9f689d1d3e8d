"""Who gets which memory on which plane, and who is frozen for it.

Pure logic: no I/O, no clock, no cgroups. The service persists and applies
what the arbiter decides.

Accounting. Every live lease holds its bytes on its plane, frozen or not:
memory a frozen lease gave up is owed back to it. So for Interactive and
Batch requests

    free = total - triage_reserve - Σ live leases

while an EmergencyTriage request may also use the triage reserve and the
bytes of frozen leases:

    free_emergency = total - Σ active leases

and when that is not enough, it preempts active leases of lower priority —
lowest priority first, newest first within a priority, a composite lease
always as a whole — until it fits. Preempted leases become `frozen`. A
frozen lease is thawed as soon as active leases leave room for it again
(normally when the emergency lease ends). Invariant: Σ active ≤ total on every
plane, always.

Compute. Memory is not all an emergency may need: on the CPU plane the
triage model and a Batch stream fit side by side and still fight for the
same cores. An *exclusive* EmergencyTriage lease takes the plane's compute
too: every active lower-priority lease on its planes is frozen while it
lives, memory or not, and none of them thaws before it ends.
"""

from collections.abc import Iterable
from dataclasses import dataclass, replace

PRIORITIES = {"EmergencyTriage": 100, "Interactive": 10, "Batch": 0}
EMERGENCY = "EmergencyTriage"

#: No single lease may ask for more than this (1 PiB): absurd sizes are bad input.
MAX_LEASE_BYTES = 1 << 50


class ArbiterError(Exception):
    """Base of the arbiter's refusals."""


class InvalidPriority(ArbiterError):
    pass


class InvalidMemory(ArbiterError):
    pass


class PlaneUnknown(ArbiterError):
    def __init__(self, plane: str) -> None:
        super().__init__(plane)
        self.plane = plane


class PlaneInQuarantine(ArbiterError):
    def __init__(self, plane: str, reason: str) -> None:
        super().__init__(plane)
        self.plane, self.reason = plane, reason


class Exhausted(ArbiterError):
    def __init__(self, plane: str, requested: int, available: int) -> None:
        super().__init__(plane)
        self.plane, self.requested, self.available = plane, requested, available


class NotExclusive(ArbiterError):
    """Only EmergencyTriage may take a plane's compute."""


class LeaseUnknown(ArbiterError):
    def __init__(self, lease_id: str) -> None:
        super().__init__(lease_id)
        self.lease_id = lease_id


@dataclass(frozen=True, slots=True, kw_only=True)
class Plane:
    """What the arbiter needs to know of a compute plane."""

    id: str
    total: int
    triage_reserve: int = 0
    quarantined: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    id: str
    plane: str
    memory: int
    priority: str
    state: str  # "active" or "frozen"
    owner_uid: int
    pid: int | None = None
    unit: str | None = None
    group: str | None = None  # composite lease id; None for a single lease
    seq: int = 0  # grant order, for "newest first"
    #: EmergencyTriage only: holds its planes' compute, not only memory.
    exclusive: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    leases: list[Lease]
    preempted: list[Lease]


def check_request(priority: str, memory: int) -> None:
    if priority not in PRIORITIES:
        raise InvalidPriority(priority)
    if not 0 < memory <= MAX_LEASE_BYTES:
        raise InvalidMemory(memory)


class Arbiter:
    def __init__(self, planes: Iterable[Plane], leases: Iterable[Lease] = ()) -> None:
        self.planes = {plane.id: plane for plane in planes}
        self.leases: dict[str, Lease] = {lease.id: lease for lease in leases}
        self._seq = max((lease.seq for lease in self.leases.values()), default=0)

    # accounting ------------------------------------------------------------

    def _on(self, plane: str) -> list[Lease]:
        return [lease for lease in self.leases.values() if lease.plane == plane]

    def held(self, plane: str) -> int:
        return sum(lease.memory for lease in self._on(plane))

    def active(self, plane: str) -> int:
        return sum(lease.memory for lease in self._on(plane) if lease.state == "active")

    def available(self, plane: str, priority: str) -> int:
        """Bytes a request of `priority` could get without preempting."""
        p = self.planes[plane]
        if priority == EMERGENCY:
            return max(0, p.total - self.active(plane))
        return max(0, p.total - p.triage_reserve - self.held(plane))

    def _plane(self, plane: str) -> Plane:
        try:
            found = self.planes[plane]
        except KeyError:
            raise PlaneUnknown(plane) from None
        if found.quarantined is not None:
            raise PlaneInQuarantine(plane, found.quarantined)
        return found

    # preemption ------------------------------------------------------------

    def _victims(
        self, plane: str, need: int, priority: str, chosen_before: dict[str, Lease]
    ) -> list[Lease] | None:
        """Leases to freeze so `need` more bytes fit on `plane`, or None."""
        rank = PRIORITIES[priority]
        candidates = sorted(
            (
                lease
                for lease in self._on(plane)
                if lease.state == "active"
                and PRIORITIES[lease.priority] < rank
                and lease.id not in chosen_before
            ),
            key=lambda lease: (PRIORITIES[lease.priority], -lease.seq),
        )
        chosen: list[Lease] = []
        freed = 0
        for lease in candidates:
            if freed >= need:
                break
            if lease in chosen:
                continue
            # A composite lease is preempted as a whole.
            members = self.members(lease)
            chosen.extend(m for m in members if m not in chosen)
            freed += sum(m.memory for m in members if m.plane == plane)
        return chosen if freed >= need else None

    def members(self, lease: Lease) -> list[Lease]:
        if lease.group is None:
            return [lease]
        return [other for other in self.leases.values() if other.group == lease.group]

    # decisions -------------------------------------------------------------

    def acquire(
        self,
        requests: list[tuple[str, int]],
        *,
        ids: list[str],
        priority: str,
        owner_uid: int,
        pid: int | None = None,
        unit: str | None = None,
        group: str | None = None,
        exclusive: bool = False,
    ) -> Grant:
        """Grant every (plane, bytes) request, or none (raises).

        One request is a single lease; several are a composite lease whose
        members share `group`. Planes must be distinct. `exclusive`
        (EmergencyTriage only) also freezes every lower-priority lease on
        those planes.
        """
        for _, memory in requests:
            check_request(priority, memory)
        if exclusive and priority != EMERGENCY:
            raise NotExclusive(priority)
        planes = [plane for plane, _ in requests]
        if len(set(planes)) != len(planes):
            raise ArbiterError("duplicate plane")
        preempted: dict[str, Lease] = {}
        for plane, memory in requests:
            self._plane(plane)
            if exclusive:  # the plane's compute: everyone below, whole gangs
                for lease in self._on(plane):
                    if lease.state == "active" and PRIORITIES[lease.priority] < \
                            PRIORITIES[priority]:
                        preempted.update((m.id, m) for m in self.members(lease))
            free = self.available(plane, priority)
            if priority != EMERGENCY:
                if memory > free:
                    raise Exhausted(plane, memory, free)
                continue
            already = sum(v.memory for v in preempted.values() if v.plane == plane)
            if memory <= free + already:
                continue
            victims = self._victims(plane, memory - free - already, priority, preempted)
            if victims is None:
                preemptible = sum(
                    lease.memory
                    for lease in self._on(plane)
                    if lease.state == "active" and PRIORITIES[lease.priority] < PRIORITIES[priority]
                )
                raise Exhausted(plane, memory, free + preemptible)
            for victim in victims:
                preempted[victim.id] = victim
        granted: list[Lease] = []
        for lease in preempted.values():
            self.leases[lease.id] = replace(lease, state="frozen")
        for lease_id, (plane, memory) in zip(ids, requests, strict=True):
            self._seq += 1
            lease = Lease(
                id=lease_id, plane=plane, memory=memory, priority=priority, state="active",
                owner_uid=owner_uid, pid=pid, unit=unit, group=group, seq=self._seq,
                exclusive=exclusive,
            )
            self.leases[lease.id] = lease
            granted.append(lease)
        return Grant(leases=granted, preempted=[self.leases[i] for i in preempted])

    def release(self, lease_id: str) -> tuple[list[Lease], list[Lease]]:
        """Remove a lease (with its composite siblings). Returns (released,
        thawed)."""
        try:
            lease = self.leases[lease_id]
        except KeyError:
            raise LeaseUnknown(lease_id) from None
        released = self.members(lease)
        for member in released:
            del self.leases[member.id]
        return released, self.rebalance()

    def rebalance(self) -> list[Lease]:
        """Thaw frozen leases that fit again, oldest and highest first."""
        thawed: list[Lease] = []
        frozen = sorted(
            (lease for lease in self.leases.values() if lease.state == "frozen"),
            key=lambda lease: (-PRIORITIES[lease.priority], lease.seq),
        )
        done: set[str] = set()
        for lease in frozen:
            if lease.id in done:
                continue
            members = self.members(lease)
            done.update(m.id for m in members)
            if all(
                self.active(m.plane) + m.memory <= self.planes[m.plane].total
                and not self.held_exclusively(m.plane, m.priority) for m in members
            ):
                for member in members:
                    self.leases[member.id] = replace(member, state="active")
                    thawed.append(self.leases[member.id])
        return thawed

    def held_exclusively(self, plane: str, priority: str) -> bool:
        """Whether an exclusive lease above `priority` holds `plane`."""
        return any(lease.exclusive and lease.state == "active"
                   and PRIORITIES[lease.priority] > PRIORITIES[priority]
                   for lease in self._on(plane))

    def set_frozen(self, lease_id: str, frozen: bool) -> list[Lease]:
        """Explicit Freeze/Thaw of a lease (and its composite siblings)."""
        try:
            lease = self.leases[lease_id]
        except KeyError:
            raise LeaseUnknown(lease_id) from None
        members = self.members(lease)
        if not frozen and any(
            self.active(m.plane) + m.memory > self.planes[m.plane].total
            or self.held_exclusively(m.plane, m.priority)
            for m in members
            if m.state == "frozen"
        ):
            raise Exhausted(lease.plane, lease.memory, self.available(lease.plane, EMERGENCY))
        state = "frozen" if frozen else "active"
        for member in members:
            self.leases[member.id] = replace(member, state=state)
        return [self.leases[m.id] for m in members]
