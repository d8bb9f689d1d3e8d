"""inferenced's lease keeping: the arbiter's decisions, made durable and
then applied to the host.

A decision is made in memory under `lock` (`grant`, `release`), its write
queued for the store's next group commit; `settle` waits for that commit
and only then freezes or thaws cgroups and watches pids, so nothing is
applied that a restart would not find in the database. A write that fails
reloads every lease from the database, which holds the truth.

The host is an argument (`Host`: process identity, cgroups, the freezer,
exit watches), as is the clock, so that the keeping is unit-tested with
fakes (tests/unit/inferenced/test_leases.py); `LinuxHost` is the real one.
The Varlink face (service.py) validates, authorizes and turns the errors
raised here into the contract's.
"""

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from syntrop.inferenced import arbiter as arb
from syntrop.inferenced.store import Group, LeaseRecord, Store
from syntrop.system import cgroup, process

logger = logging.getLogger(__name__)

FREEZE_TIMEOUT = 0.25
#: Exit watches kept on processes that hold no lease now, most recent
#: first: a client that leases again and again keeps one pidfd instead of
#: opening and closing one per lease.
IDLE_WATCHES = 64


class NoSuchProcess(arb.ArbiterError):
    """The pid a lease names is not a running process."""


class ForeignProcess(arb.ArbiterError):
    """A lease's cgroup holds a process of a user other than its owner,
    who may not freeze it."""

    def __init__(self, lease_id: str, uid: int) -> None:
        super().__init__(lease_id, uid)
        self.lease_id, self.uid = lease_id, uid


def foreign_uid(owner_uid: int, for_others: bool, found: set[int]) -> int | None:
    """The uid that forbids freezing a lease's cgroup: one of `found` (the
    uids of the processes in it now) other than the owner's, unless the
    owner is root or could name others' processes when granted. None when
    the cgroup may be frozen. The grant checked the same; a process may
    have entered the cgroup since, so every freeze asks again."""
    if for_others or owner_uid == 0:
        return None
    return min(found - {owner_uid}, default=None)


class Host(Protocol):
    """What lease keeping needs of the machine."""

    #: inferenced's own cgroup: never frozen, nor any cgroup containing it.
    own_cgroup: str | None

    def start_time(self, pid: int) -> int | None: ...
    def alive(self, pid: int, started: int | None) -> bool: ...
    def cgroup_of_pid(self, pid: int) -> str | None: ...
    def unit_cgroup(self, unit: str) -> str | None: ...
    def is_frozen(self, group: str) -> bool: ...
    def set_frozen(self, group: str, frozen: bool) -> None: ...
    def uids_in(self, group: str) -> set[int]:
        """The uids of the processes in `group` and below it."""
        ...
    def watch_exit(self, pid: int, on_exit: Callable[[], None]) -> Callable[[], None] | None: ...

    def close(self) -> None:
        """Let go of what it holds open (pidfds)."""


class LinuxHost:
    """/proc, the cgroup v2 freezer and pidfds. Without a cgroup2 mount
    nothing has a cgroup, and a lease is frozen in the books only."""

    def __init__(self, mount: Path | None) -> None:
        self.mount = mount
        self.own_cgroup = cgroup.cgroup_of_pid(os.getpid())
        self._start_times = process.StartTimes()

    def start_time(self, pid: int) -> int | None:
        return self._start_times.get(pid)

    def alive(self, pid: int, started: int | None) -> bool:
        return process.alive(pid, started)

    def cgroup_of_pid(self, pid: int) -> str | None:
        return cgroup.cgroup_of_pid(pid) if self.mount is not None else None

    def unit_cgroup(self, unit: str) -> str | None:
        return cgroup.unit_cgroup(self.mount, unit) if self.mount is not None else None

    def _directory(self, group: str) -> Path:
        if self.mount is None:
            raise cgroup.CgroupError("no cgroup2 mount")
        return self.mount / group.lstrip("/")

    def is_frozen(self, group: str) -> bool:
        return cgroup.is_frozen(self._directory(group))

    def set_frozen(self, group: str, frozen: bool) -> None:
        cgroup.set_frozen(self._directory(group), frozen, timeout=FREEZE_TIMEOUT)

    def uids_in(self, group: str) -> set[int]:
        return cgroup.uids_in(self.mount, group) if self.mount is not None else set()

    def watch_exit(self, pid: int, on_exit: Callable[[], None]) -> Callable[[], None] | None:
        return process.watch_exit(pid, on_exit)

    def close(self) -> None:
        self._start_times.close()


@dataclass(slots=True)
class Pending:
    """A decision made in memory whose write is queued: the commit to await
    before replying, then what to apply (`Leases.settle`)."""

    commit: "asyncio.Future[None]"
    #: Leases whose cgroup is brought to their state once committed.
    cgroups: list[str] = field(default_factory=list)
    #: Released while frozen: their cgroups are thawed.
    released_frozen: list[LeaseRecord] = field(default_factory=list)
    #: Memfds of released leases, closed once committed.
    buffers: list[int] = field(default_factory=list)
    #: A process to watch, (pid, start time): the lease lives and dies with it.
    watch: tuple[int, int | None] | None = None


def _log_failure(task: "asyncio.Task[None]") -> None:
    """A background release that failed is said, not swallowed: its leases
    stay held (and are released on the next restart's scan)."""
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.error("releasing the leases of an exited process failed: %s", error,
                     exc_info=error)


class Leases:
    """The leases in memory, the arbiter deciding them, the store keeping
    them, and the host they are applied to."""

    def __init__(self, store: Store, planes: Callable[[], list[arb.Plane]], host: Host,
                 clock: Callable[[], float] = time.monotonic, *,
                 loaded: tuple[list[LeaseRecord], list[Group]] | None = None) -> None:
        """`loaded`: the store's leases and groups when the caller has just
        read them (inferenced's start reads the store once)."""
        self.store, self.planes, self.host, self.clock = store, planes, host, clock
        records, groups = loaded if loaded is not None else store.load()[:2]
        self.records = {r.lease.id: r for r in records}
        self.groups = {g.id: g for g in groups}
        self.arbiter = arb.Arbiter(planes(), (r.lease for r in records))
        #: pid -> (its start time, what stops watching its exit), the most
        #: recently used last.
        self.watches: dict[int, tuple[int | None, Callable[[], None]]] = {}
        self.buffers: dict[str, int] = {}  # lease id -> memfd
        self.lock = asyncio.Lock()
        #: Seconds each freeze took, for the benchmark.
        self.freeze_latencies: list[float] = []

    async def restore(self) -> None:
        """After a restart: drop leases whose process is gone, re-freeze what
        must stay frozen, watch the rest."""
        dead = [r.lease.id for r in self.records.values()
                if r.lease.pid is not None and not self.host.alive(r.lease.pid, r.pid_start)]
        for lease_id in dead:
            if lease_id in self.arbiter.leases:
                logger.info("lease %s: its process is gone, releasing", lease_id)
                await self.settle(self.release(lease_id))
        for record in self.records.values():
            self._apply_freeze(record, record.lease.state == "frozen")
            if record.lease.pid is not None:
                self._watch(record.lease.pid, record.pid_start)

    # cgroups and pids --------------------------------------------------------

    def target_cgroup(self, unit: str | None, pid: int | None) -> str | None:
        """The cgroup a lease freezes: its unit's, else its pid's; never the
        root, nor one containing inferenced."""
        found = self.host.unit_cgroup(unit) if unit else None
        if found is None and pid is not None:
            found = self.host.cgroup_of_pid(pid)
        if found is None or found == "/":
            return None
        own = self.host.own_cgroup
        if own is not None and cgroup.contains(found, own):
            logger.warning("cgroup %s contains inferenced itself: never frozen", found)
            return None
        return found

    def _foreign(self, record: LeaseRecord) -> int | None:
        """A uid in the lease's cgroup that forbids freezing it (`foreign_uid`)."""
        if record.cgroup is None:
            return None
        return foreign_uid(record.lease.owner_uid, record.for_others,
                           self.host.uids_in(record.cgroup))

    def _apply_freeze(self, record: LeaseRecord, frozen: bool) -> None:
        if record.cgroup is None:
            return
        if frozen and (uid := self._foreign(record)) is not None:
            # Preemption goes on for the others; the books keep it frozen.
            logger.warning("lease %s: cgroup %s holds a process of uid %d, not its owner's "
                           "(uid %d): not frozen", record.lease.id, record.cgroup, uid,
                           record.lease.owner_uid)
            return
        # Siblings of a composite lease share a cgroup: freeze it once.
        started = self.clock()
        try:
            if self.host.is_frozen(record.cgroup) != frozen:
                self.host.set_frozen(record.cgroup, frozen)
        except cgroup.CgroupError as error:
            logger.warning("lease %s: %s, ignoring", record.lease.id, error)
            return
        if frozen:
            self.freeze_latencies.append(self.clock() - started)

    def _watch(self, pid: int, started: int | None) -> None:
        held = self.watches.pop(pid, None)
        if held is not None and held[0] != started:  # the pid was reused
            held[1]()
            held = None
        if held is None:
            stop = self.host.watch_exit(pid, functools.partial(self._exited, pid, started))
            if stop is None:
                return
            held = (started, stop)
        self.watches[pid] = held  # the most recently used last

    def _unwatch_unused(self) -> None:
        """Stop watching processes without leases, past the IDLE_WATCHES
        most recently used."""
        if len(self.watches) <= IDLE_WATCHES:
            return
        used = {r.lease.pid for r in self.records.values()}
        unused = [pid for pid in self.watches if pid not in used]
        for pid in unused[:max(0, len(unused) - IDLE_WATCHES)]:
            self.watches.pop(pid)[1]()

    def _exited(self, pid: int, started: int | None) -> None:
        if self.watches.get(pid, (started,))[0] == started:
            self.watches.pop(pid, None)  # the host has stopped watching it
        owned = [r.lease.id for r in self.records.values()
                 if r.lease.pid == pid and r.pid_start == started]
        if owned:
            task = asyncio.get_running_loop().create_task(self.release_dead(owned))
            task.add_done_callback(_log_failure)

    async def release_dead(self, lease_ids: list[str]) -> None:
        async with self.lock:
            for lease_id in lease_ids:
                if lease_id in self.arbiter.leases:
                    logger.info("lease %s: its process exited, releasing", lease_id)
                    await self.settle(self.release(lease_id))

    # decisions (the lock held) -----------------------------------------------

    def grant(
        self,
        requests: list[tuple[str, int]],
        *,
        priority: str,
        owner_uid: int,
        leaser_pid: int,
        unit: str | None,
        pid: int | None,
        group: Group | None = None,
        slices: "list[tuple[str | None, int | None]] | None" = None,
        exclusive: bool = False,
        for_others: bool = False,
    ) -> tuple[list[arb.Lease], Pending]:
        """Decide a grant and queue its write: the leases, and what `settle`
        must await and apply. `slices`: each lease's (role, stage index) of
        a composite lease. `for_others`: the owner may name other users'
        processes (`foreign_uid`). Raises the arbiter's errors, and
        NoSuchProcess."""
        pid_start = self.host.start_time(pid) if pid is not None else None
        if pid is not None and pid_start is None:
            raise NoSuchProcess(pid)
        ids = [f"lease-{os.urandom(6).hex()}" for _ in requests]
        grant = self.arbiter.acquire(
            requests, ids=ids, priority=priority, owner_uid=owner_uid, pid=pid,
            unit=unit, group=group.id if group else None, exclusive=exclusive,
        )
        target = self.target_cgroup(unit, pid)
        if target is not None and unit is None and pid != leaser_pid and \
                target == self.host.cgroup_of_pid(leaser_pid):
            # A child in its parent's cgroup (a daemon's worker that has no
            # cgroup of its own): freezing it would freeze the caller too.
            logger.info("lease for pid %s: its cgroup %s is its leaser's; never frozen",
                        pid, target)
            target = None
        new = []
        for index, lease in enumerate(grant.leases):
            role, stage = slices[index] if slices else (None, None)
            new.append(LeaseRecord(lease=lease, pid_start=pid_start, cgroup=target,
                                   role=role, stage_index=stage, for_others=for_others))
        changed = [replace(self.records[v.id], lease=v) for v in grant.preempted]
        # Memory first, the write queued in decision order; the reply waits
        # for it (`settle`), and a write that fails reloads the truth.
        commit = self.store.save_later(new + changed, group=group)
        for record in new + changed:
            self.records[record.lease.id] = record
        if group is not None:
            self.groups[group.id] = group
        watch = (pid, pid_start) if pid is not None else None
        return grant.leases, Pending(commit, cgroups=[r.lease.id for r in changed], watch=watch)

    def release(self, lease_id: str) -> Pending:
        """Release a lease (with its composite siblings) and queue its
        write; `settle` applies the thaws once it is committed. Raises
        arb.LeaseUnknown."""
        released, thawed = self.arbiter.release(lease_id)
        groups = {lease.group for lease in released if lease.group}
        thawed_records = [replace(self.records[t.id], lease=t) for t in thawed]
        commit = self.store.save_later(
            thawed_records, remove=[lease.id for lease in released], drop_groups=sorted(groups)
        )
        pending = Pending(commit, cgroups=[r.lease.id for r in thawed_records])
        for lease in released:
            record = self.records.pop(lease.id)
            if lease.state == "frozen":
                pending.released_frozen.append(record)
            buffer = self.buffers.pop(lease.id, None)
            if buffer is not None:
                pending.buffers.append(buffer)
        for group_id in groups:
            self.groups.pop(group_id, None)
        for record in thawed_records:
            self.records[record.lease.id] = record
        return pending

    async def set_frozen(self, lease_id: str, frozen: bool) -> None:
        """Freeze or thaw a lease (and its composite siblings) by request.
        Raises arb.LeaseUnknown, arb.Exhausted, and ForeignProcess when its
        cgroup holds another user's process now (siblings share it)."""
        async with self.lock:
            if lease_id not in self.records:
                raise arb.LeaseUnknown(lease_id)  # released meanwhile
            if frozen and (uid := self._foreign(self.records[lease_id])) is not None:
                raise ForeignProcess(lease_id, uid)
            changed = self.arbiter.set_frozen(lease_id, frozen)
            await self.store.set_states({lease.id: lease.state for lease in changed})
            for lease in changed:
                record = replace(self.records[lease.id], lease=lease)
                self.records[lease.id] = record
                self._apply_freeze(record, frozen)

    # after the commit --------------------------------------------------------

    async def settle(self, pending: Pending) -> None:
        """Wait until a decision is committed, then bring the cgroups it
        touched to the state the arbiter holds *now* (a later decision may
        have changed it meanwhile). A failed write reloads every lease from
        the database, which holds the truth, and fails the call."""
        try:
            await pending.commit
        except BaseException as error:
            logger.error("a lease change was not written (%s): reloading from the database",
                         error)
            await self.reload()
            raise
        for lease_id in pending.cgroups:
            record = self.records.get(lease_id)
            if record is not None:
                self._apply_freeze(record, record.lease.state == "frozen")
        for record in pending.released_frozen:
            self._apply_freeze(record, False)
        for buffer in pending.buffers:
            os.close(buffer)
        if pending.watch is not None:
            self._watch(*pending.watch)
        self._unwatch_unused()

    async def reload(self) -> None:
        """Leases, groups and the arbiter as the database has them, and
        every cgroup brought to that state."""
        async with self.lock:
            records, groups, _, _ = self.store.load()
            self.records = {r.lease.id: r for r in records}
            self.groups = {g.id: g for g in groups}
            self.arbiter = arb.Arbiter(self.planes(), (r.lease for r in records))
            for record in records:
                self._apply_freeze(record, record.lease.state == "frozen")

    def lease_or_gang(self, lease_id: str) -> LeaseRecord | None:
        """A lease by its id, or a composite lease's first member by the
        composite's id."""
        return self.records.get(lease_id) or next(
            (r for r in self.records.values() if r.lease.group == lease_id), None)

    def close(self) -> None:
        for _, stop in self.watches.values():
            stop()
        self.watches.clear()
        for fd in self.buffers.values():
            os.close(fd)
        self.buffers.clear()
        self.host.close()
