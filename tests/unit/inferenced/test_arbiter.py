"""The arbiter: priorities, preemption, composite leases, and a stateful
property test of its invariants."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from syntrop.inferenced.arbiter import (
    PRIORITIES,
    Arbiter,
    ArbiterError,
    Exhausted,
    InvalidMemory,
    InvalidPriority,
    LeaseUnknown,
    Plane,
    PlaneInQuarantine,
    PlaneUnknown,
)

GiB = 1 << 30


def arbiter() -> Arbiter:
    return Arbiter(
        [Plane(id="gpu0", total=8 * GiB, triage_reserve=1 * GiB), Plane(id="gpu1", total=8 * GiB)]
    )


def take(a: Arbiter, lease_id: str, plane: str, memory: int, priority: str) -> list[str]:
    grant = a.acquire([(plane, memory)], ids=[lease_id], priority=priority, owner_uid=0)
    return [lease.id for lease in grant.preempted]


def test_triage_reserve_is_kept_from_lower_priorities() -> None:
    a = arbiter()
    with pytest.raises(Exhausted) as caught:
        take(a, "b", "gpu0", 7 * GiB + 1, "Batch")
    assert (caught.value.requested, caught.value.available) == (7 * GiB + 1, 7 * GiB)
    take(a, "b", "gpu0", 7 * GiB, "Batch")
    assert take(a, "e", "gpu0", 1 * GiB, "EmergencyTriage") == []


def test_emergency_preempts_lowest_then_newest_and_thaws_on_release() -> None:
    a = arbiter()
    take(a, "i", "gpu1", 4 * GiB, "Interactive")
    take(a, "b1", "gpu1", 2 * GiB, "Batch")
    take(a, "b2", "gpu1", 2 * GiB, "Batch")
    assert take(a, "e", "gpu1", 2 * GiB, "EmergencyTriage") == ["b2"]
    assert a.leases["b2"].state == "frozen" and a.leases["b1"].state == "active"
    # Frozen memory is owed: nobody but an emergency may take it.
    with pytest.raises(Exhausted):
        take(a, "x", "gpu1", 1, "Interactive")
    released, thawed = a.release("e")
    assert [lease.id for lease in released] == ["e"]
    assert [lease.id for lease in thawed] == ["b2"]


def test_emergency_never_preempts_equal_priority() -> None:
    a = arbiter()
    take(a, "e1", "gpu1", 8 * GiB, "EmergencyTriage")
    with pytest.raises(Exhausted) as caught:
        take(a, "e2", "gpu1", 1, "EmergencyTriage")
    assert caught.value.available == 0


def test_composite_is_all_or_nothing_and_preempted_as_a_whole() -> None:
    a = arbiter()
    a.acquire(
        [("gpu0", 6 * GiB), ("gpu1", 6 * GiB)], ids=["g.0", "g.1"],
        priority="Batch", owner_uid=0, group="g",
    )
    with pytest.raises(Exhausted):
        a.acquire(
            [("gpu0", 1 * GiB), ("gpu1", 3 * GiB)], ids=["h.0", "h.1"],
            priority="Interactive", owner_uid=0, group="h",
        )
    assert set(a.leases) == {"g.0", "g.1"}
    assert take(a, "e", "gpu1", 4 * GiB, "EmergencyTriage") == ["g.0", "g.1"]
    assert {a.leases["g.0"].state, a.leases["g.1"].state} == {"frozen"}
    _, thawed = a.release("e")
    assert sorted(lease.id for lease in thawed) == ["g.0", "g.1"]
    released, _ = a.release("g.1")
    assert sorted(lease.id for lease in released) == ["g.0", "g.1"]


@pytest.mark.parametrize(
    ("priority", "memory", "error"),
    [
        ("Urgent", 1, InvalidPriority),
        ("Batch", 0, InvalidMemory),
        ("Batch", -5, InvalidMemory),
        ("Batch", 1 << 60, InvalidMemory),
    ],
)
def test_bad_requests_change_nothing(priority: str, memory: int, error: type[Exception]) -> None:
    a = arbiter()
    with pytest.raises(error):
        a.acquire([("gpu0", memory)], ids=["x"], priority=priority, owner_uid=0)
    assert a.leases == {}


def test_unknown_and_quarantined_planes_and_duplicates() -> None:
    a = Arbiter([Plane(id="gpu0", total=GiB, quarantined="Xid 79")])
    with pytest.raises(PlaneUnknown):
        take(a, "x", "gpu9", 1, "Batch")
    with pytest.raises(PlaneInQuarantine) as caught:
        take(a, "x", "gpu0", 1, "EmergencyTriage")
    assert caught.value.reason == "Xid 79"
    with pytest.raises(ArbiterError):
        arbiter().acquire(
            [("gpu1", 1), ("gpu1", 1)], ids=["a", "b"], priority="Batch", owner_uid=0, group="g"
        )
    with pytest.raises(LeaseUnknown):
        a.release("nope")


class ArbiterMachine(RuleBasedStateMachine):
    """Random acquire / release / freeze / thaw sequences; after every step:
    sum of active <= total per plane, no lease lost or duplicated, and an
    emergency request is granted whenever preemptible capacity exists."""

    def __init__(self) -> None:
        super().__init__()
        self.arbiter = Arbiter(
            [Plane(id="p0", total=10, triage_reserve=2), Plane(id="p1", total=6)]
        )
        self.expected: set[str] = set()
        self.counter = 0

    def _id(self) -> str:
        self.counter += 1
        return f"l{self.counter}"

    @rule(
        plane=st.sampled_from(["p0", "p1"]),
        memory=st.integers(1, 12),
        priority=st.sampled_from(list(PRIORITIES)),
    )
    def acquire(self, plane: str, memory: int, priority: str) -> None:
        a = self.arbiter
        preemptible = sum(
            lease.memory
            for lease in a.leases.values()
            if lease.plane == plane
            and lease.state == "active"
            and PRIORITIES[lease.priority] < PRIORITIES[priority]
        )
        could = a.available(plane, priority)
        if priority == "EmergencyTriage":
            could += preemptible
        lease_id = self._id()
        try:
            a.acquire([(plane, memory)], ids=[lease_id], priority=priority, owner_uid=0)
        except Exhausted:
            assert memory > could
        else:
            assert memory <= could
            self.expected.add(lease_id)

    @rule(
        planes=st.permutations(["p0", "p1"]),
        memory=st.integers(1, 7),
        priority=st.sampled_from(list(PRIORITIES)),
    )
    def acquire_gang(self, planes: list[str], memory: int, priority: str) -> None:
        group = self._id()
        ids = [f"{group}.{p}" for p in planes]
        before = dict(self.arbiter.leases)
        try:
            self.arbiter.acquire(
                [(p, memory) for p in planes], ids=ids, priority=priority, owner_uid=0, group=group
            )
        except Exhausted:
            assert self.arbiter.leases == before
        else:
            self.expected.update(ids)

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.expected)))
        released, _ = self.arbiter.release(lease_id)
        for lease in released:
            self.expected.discard(lease.id)

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data(), frozen=st.booleans())
    def freeze_or_thaw(self, data: st.DataObject, frozen: bool) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.expected)))
        try:
            self.arbiter.set_frozen(lease_id, frozen)
        except Exhausted:
            assert not frozen

    @invariant()
    def active_fits(self) -> None:
        for plane in self.arbiter.planes.values():
            assert self.arbiter.active(plane.id) <= plane.total

    @invariant()
    def nothing_lost_or_duplicated(self) -> None:
        assert set(self.arbiter.leases) == self.expected


ArbiterMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)
test_arbiter_state_machine = ArbiterMachine.TestCase


def test_an_exclusive_emergency_takes_the_planes_compute_and_gives_it_back() -> None:
    """Memory fits for everyone, yet an exclusive emergency freezes every
    lower-priority lease on its plane (a gang as a whole), none of them
    thaws while it lives (not even by an explicit Thaw), and all thaw when it
    ends; leases on other planes are untouched."""
    from syntrop.inferenced.arbiter import NotExclusive

    a = arbiter()
    take(a, "i", "gpu1", 1 * GiB, "Interactive")
    take(a, "b", "gpu1", 1 * GiB, "Batch")
    take(a, "other", "gpu0", 1 * GiB, "Batch")
    a.acquire([("gpu1", GiB), ("gpu0", GiB)], ids=["g.0", "g.1"], priority="Batch",
              owner_uid=0, group="g")
    assert take(a, "plain", "gpu1", 1 * GiB, "EmergencyTriage") == []  # memory fits
    a.release("plain")
    grant = a.acquire([("gpu1", 64 << 20)], ids=["e"], priority="EmergencyTriage",
                      owner_uid=0, exclusive=True)
    assert sorted(lease.id for lease in grant.preempted) == ["b", "g.0", "g.1", "i"]
    assert a.leases["other"].state == "active" and a.leases["e"].exclusive
    assert a.rebalance() == []
    with pytest.raises(Exhausted):
        a.set_frozen("b", False)
    _, thawed = a.release("e")
    assert sorted(lease.id for lease in thawed) == ["b", "g.0", "g.1", "i"]
    with pytest.raises(NotExclusive):
        a.acquire([("gpu1", 1)], ids=["x"], priority="Interactive", owner_uid=0,
                  exclusive=True)
