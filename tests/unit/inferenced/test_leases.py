"""inferenced's lease keeping (inferenced/leases.py) against a fake host and
clock, over a real SQLite store: what is applied to cgroups and when, exit
watches and pid reuse, restarts, and a write that fails."""

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from syntrop.inferenced import arbiter as arb
from syntrop.inferenced.leases import (
    IDLE_WATCHES,
    ForeignProcess,
    Leases,
    NoSuchProcess,
    Pending,
    foreign_uid,
)
from syntrop.inferenced.store import Store

GiB = 1 << 30
PLANES = [arb.Plane(id="gpu0", total=8 * GiB)]
LEASER = 100  # the caller's pid


class FakeHost:
    own_cgroup: str | None = "/system.slice/inferenced.service"

    def __init__(self) -> None:
        self.processes: dict[int, int] = {LEASER: 1}  # pid -> start time
        self.cgroups: dict[int, str] = {LEASER: "/user.slice/client.scope"}
        self.units: dict[str, str] = {}
        self.frozen: set[str] = set()
        self.uids: dict[str, set[int]] = {}  # cgroup -> the uids of its processes
        self.watching: dict[int, Callable[[], None]] = {}
        self.opened = 0  # watches begun, ever

    def spawn(self, pid: int, start: int, group: str) -> None:
        self.processes[pid], self.cgroups[pid] = start, group

    def exit(self, pid: int) -> None:
        del self.processes[pid]
        self.watching.pop(pid)()

    def start_time(self, pid: int) -> int | None:
        return self.processes.get(pid)

    def alive(self, pid: int, started: int | None) -> bool:
        return pid in self.processes and started in (None, self.processes[pid])

    def cgroup_of_pid(self, pid: int) -> str | None:
        return self.cgroups.get(pid)

    def unit_cgroup(self, unit: str) -> str | None:
        return self.units.get(unit)

    def is_frozen(self, group: str) -> bool:
        return group in self.frozen

    def set_frozen(self, group: str, frozen: bool) -> None:
        (self.frozen.add if frozen else self.frozen.discard)(group)

    def uids_in(self, group: str) -> set[int]:
        return self.uids.get(group, set())

    def watch_exit(self, pid: int, on_exit: Callable[[], None]) -> Callable[[], None] | None:
        if pid not in self.processes:
            return None
        self.opened += 1
        self.watching[pid] = on_exit
        return lambda: self.watching.pop(pid, None) and None

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.005
        return self.now


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "inferenced.db")
    yield store
    store.close()


def _keeper(store: Store, host: FakeHost) -> Leases:
    return Leases(store, lambda: list(PLANES), host, Clock())


async def _grant(leases: Leases, priority: str, memory: int, pid: int | None = LEASER,
                 unit: str | None = None, owner_uid: int = 0,
                 for_others: bool = False) -> tuple[str, Pending]:
    async with leases.lock:
        (lease,), pending = leases.grant([("gpu0", memory)], priority=priority,
                                         owner_uid=owner_uid, leaser_pid=LEASER, unit=unit,
                                         pid=pid, for_others=for_others)
    return lease.id, pending


def test_a_preempted_cgroup_is_frozen_once_committed_and_thawed_on_release(
        host: FakeHost, store: Store) -> None:
    host.spawn(200, 7, "/system.slice/batch.service")

    async def scenario() -> None:
        leases = _keeper(store, host)
        batch, pending = await _grant(leases, "Batch", 6 * GiB, pid=200)
        await leases.settle(pending)
        emergency, pending = await _grant(leases, "EmergencyTriage", 4 * GiB)
        assert leases.records[batch].lease.state == "frozen"  # decided ...
        assert host.frozen == set()  # ... not applied before the commit
        await leases.settle(pending)
        assert host.frozen == {"/system.slice/batch.service"}
        assert leases.freeze_latencies == [pytest.approx(0.005)]  # the clock given
        async with leases.lock:
            pending = leases.release(emergency)
        await leases.settle(pending)
        assert host.frozen == set()
        assert leases.records[batch].lease.state == "active"
        assert [r.lease.id for r in store.load()[0]] == [batch]  # what the disk holds
        leases.close()

    asyncio.run(scenario())


def test_never_frozen_root_own_cgroup_or_the_leasers(host: FakeHost, store: Store) -> None:
    host.spawn(300, 1, "/")
    host.spawn(301, 1, "/system.slice")  # contains inferenced's own cgroup
    host.spawn(302, 1, "/user.slice/client.scope")  # a child in its leaser's cgroup
    host.units["ok.service"] = "/system.slice/ok.service"
    leases = _keeper(store, host)
    assert leases.target_cgroup(None, 300) is None
    assert leases.target_cgroup(None, 301) is None
    assert leases.target_cgroup("ok.service", 302) == "/system.slice/ok.service"

    async def scenario() -> None:
        lease_id, pending = await _grant(leases, "Batch", GiB, pid=302)
        await leases.settle(pending)
        assert leases.records[lease_id].cgroup is None
        leases.close()

    asyncio.run(scenario())


def test_a_dead_pid_is_refused(host: FakeHost, store: Store) -> None:
    leases = _keeper(store, host)

    async def scenario() -> None:
        with pytest.raises(NoSuchProcess):
            await _grant(leases, "Batch", GiB, pid=999)
        assert leases.records == {}

    asyncio.run(scenario())


def test_an_exit_releases_and_a_reused_pid_is_not_taken_for_the_old_process(
        host: FakeHost, store: Store) -> None:
    host.spawn(400, 10, "/system.slice/a.service")

    async def scenario() -> None:
        leases = _keeper(store, host)
        first, pending = await _grant(leases, "Batch", GiB, pid=400)
        await leases.settle(pending)
        async with leases.lock:
            pending = leases.release(first)
        await leases.settle(pending)
        assert 400 in leases.watches  # kept past its last lease
        again, pending = await _grant(leases, "Batch", GiB, pid=400)
        await leases.settle(pending)
        assert host.opened == 1  # the same watch, not a new one
        host.exit(400)
        for _ in range(20):
            await asyncio.sleep(0)
        assert again not in leases.records and store.load()[0] == []
        # pid 400 again, another process: its own watch, its own lease.
        host.spawn(400, 11, "/system.slice/b.service")
        reborn, pending = await _grant(leases, "Batch", GiB, pid=400)
        await leases.settle(pending)
        assert host.opened == 2 and leases.watches[400][0] == 11
        leases._exited(400, 10)  # the old process's exit, seen late
        for _ in range(20):
            await asyncio.sleep(0)
        assert reborn in leases.records and leases.records[reborn].pid_start == 11
        leases.close()

    asyncio.run(scenario())


def test_idle_watches_are_bounded(host: FakeHost, store: Store) -> None:
    pids = range(1000, 1000 + IDLE_WATCHES + 3)
    for pid in pids:
        host.spawn(pid, 1, f"/app-{pid}.scope")

    async def scenario() -> None:
        leases = _keeper(store, host)
        for pid in pids:
            lease_id, pending = await _grant(leases, "Batch", GiB, pid=pid)
            await leases.settle(pending)
            async with leases.lock:
                pending = leases.release(lease_id)
            await leases.settle(pending)
        assert list(leases.watches) == list(pids)[-IDLE_WATCHES:]  # the most recent kept
        assert len(host.watching) == IDLE_WATCHES
        leases.close()
        assert host.watching == {}

    asyncio.run(scenario())


def test_restore_drops_the_dead_and_refreezes_the_frozen(host: FakeHost, store: Store) -> None:
    host.spawn(500, 5, "/system.slice/gone.service")
    host.spawn(501, 5, "/system.slice/stays.service")

    async def before() -> tuple[str, str]:
        leases = _keeper(store, host)
        gone, pending = await _grant(leases, "Batch", GiB, pid=500)
        await leases.settle(pending)
        stays, pending = await _grant(leases, "Batch", 6 * GiB, pid=501)
        await leases.settle(pending)
        _, pending = await _grant(leases, "EmergencyTriage", 4 * GiB)
        await leases.settle(pending)
        assert host.frozen == {"/system.slice/stays.service"}  # the newest Batch lease
        leases.close()
        return gone, stays

    gone, stays = asyncio.run(before())
    del host.processes[500]  # died while inferenced was down
    host.frozen.clear()  # and the freezes were undone by hand

    async def after() -> None:
        leases = _keeper(store, host)
        await leases.restore()
        assert gone not in leases.records and stays in leases.records
        assert "/system.slice/stays.service" in host.frozen
        assert set(leases.watches) == {501, LEASER}
        leases.close()

    asyncio.run(after())


def test_a_failed_write_reloads_what_the_database_holds(host: FakeHost, store: Store) -> None:
    async def scenario() -> None:
        leases = _keeper(store, host)
        kept, pending = await _grant(leases, "Batch", GiB)
        await leases.settle(pending)
        failing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failing.set_exception(OSError("disk full"))
        store.save_later = lambda *a, **k: failing  # type: ignore[method-assign]
        lost, pending = await _grant(leases, "Batch", GiB)
        assert lost in leases.records  # decided in memory ...
        with pytest.raises(OSError):
            await leases.settle(pending)
        assert set(leases.records) == {kept}  # ... and taken back: the disk never had it
        assert set(leases.arbiter.leases) == {kept}
        leases.close()

    asyncio.run(scenario())


def test_a_database_of_the_rowid_schema_keeps_its_leases_when_migrated(tmp_path: Path) -> None:
    """Schema 3 rebuilds the leases table keyed by id (WITHOUT ROWID); the
    leases a database of schema 2 holds come through whole."""
    from syntrop.inferenced.store import MIGRATIONS
    from syntrop.system.sqlite import Database

    path = tmp_path / "inferenced.db"
    old = Database(path, MIGRATIONS[:2])
    old.sync(lambda c: c.execute(
        "INSERT INTO leases VALUES ('lease-1', 'gpu0', 4096, 'Batch', 'frozen', 1000, 200, 7, "
        "'batch.service', '/system.slice/batch.service', NULL, NULL, NULL, 3, 0)"))
    old.close()
    store = Store(path)
    try:
        (record,), _, _, _ = store.load()
        table = store.db.sync(lambda c: c.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'leases'").fetchone()[0])
    finally:
        store.close()
    assert "WITHOUT ROWID" in table
    assert record.lease == arb.Lease(id="lease-1", plane="gpu0", memory=4096, priority="Batch",
                                     state="frozen", owner_uid=1000, pid=200,
                                     unit="batch.service", group=None, seq=3, exclusive=False)
    assert (record.pid_start, record.cgroup) == (7, "/system.slice/batch.service")


@pytest.mark.parametrize(("owner", "for_others", "found", "refused_by"), [
    (1000, False, set(), None),  # an empty cgroup
    (1000, False, {1000}, None),  # only the owner's processes
    (1000, False, {1000, 0}, 0),  # root entered it
    (1000, False, {1000, 1001, 1002}, 1001),
    (1000, True, {1000, 0}, None),  # lease-others was granted
    (0, False, {0, 1000}, None),  # root's lease
])
def test_a_cgroup_is_frozen_only_around_its_owners_processes(
        owner: int, for_others: bool, found: set[int], refused_by: int | None) -> None:
    assert foreign_uid(owner, for_others, found) == refused_by


def test_a_process_of_another_user_entering_after_the_grant_is_never_frozen(
        host: FakeHost, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The grant found only the owner's processes; root's entered later.
    The owner's Freeze is refused and preemption leaves that cgroup
    running, freezing the others; thawing stays allowed."""
    mine, theirs = "/user.slice/mine.scope", "/user.slice/theirs.scope"
    host.spawn(600, 6, mine)
    host.spawn(601, 6, theirs)
    host.uids = {mine: {1000}, theirs: {1001}}

    async def scenario() -> None:
        leases = _keeper(store, host)
        lease, pending = await _grant(leases, "Batch", 3 * GiB, pid=600, owner_uid=1000)
        await leases.settle(pending)
        _, pending = await _grant(leases, "Batch", 3 * GiB, pid=601, owner_uid=1001)
        await leases.settle(pending)
        await leases.set_frozen(lease, True)
        assert host.frozen == {mine}
        host.uids[mine].add(0)  # after the grant
        await leases.set_frozen(lease, False)  # thawing is always allowed
        assert host.frozen == set()
        with pytest.raises(ForeignProcess) as refused:
            await leases.set_frozen(lease, True)
        assert (refused.value.lease_id, refused.value.uid) == (lease, 0)
        assert leases.records[lease].lease.state == "active" and host.frozen == set()
        _, pending = await _grant(leases, "EmergencyTriage", 6 * GiB)
        with caplog.at_level("WARNING"):
            await leases.settle(pending)
        assert leases.records[lease].lease.state == "frozen"  # in the books
        assert host.frozen == {theirs}  # the others' preemption went on
        assert f"lease {lease}: cgroup {mine} holds a process of uid 0" in caplog.text
        leases.close()

    asyncio.run(scenario())


def test_an_owner_allowed_others_processes_freezes_them_after_a_restart(
        host: FakeHost, store: Store) -> None:
    """Lease-others granted at the grant is kept with the lease."""
    group = "/system.slice/shared.service"
    host.spawn(700, 7, group)
    host.uids[group] = {1000, 0}

    async def before() -> str:
        leases = _keeper(store, host)
        lease, pending = await _grant(leases, "Batch", GiB, pid=700, owner_uid=1000,
                                      for_others=True)
        await leases.settle(pending)
        leases.close()
        return lease

    lease = asyncio.run(before())

    async def after() -> None:
        leases = _keeper(store, host)
        await leases.restore()
        assert leases.records[lease].for_others
        await leases.set_frozen(lease, True)
        assert host.frozen == {group}
        leases.close()

    asyncio.run(after())
