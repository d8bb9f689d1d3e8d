"""The ring's bounds and indexes, time-bounded walks, ranking, the bucket."""

import random

from hypothesis import given
from hypothesis import strategies as st

from syntrop.contextd.timeline import Bucket, Record, Ring, rank, relevance

HOUR = 3600 * 1_000_000


def rec(i: int, ts: int, *keys: str, kind: str = "dropin") -> Record:
    return Record(id=i, timestamp_usec=ts, kind=kind, action="modified", summary=f"e{i}",
                  keys=keys)


def test_ring_is_bounded_and_index_follows() -> None:
    ring = Ring(3)
    evicted = []
    for i in range(1, 6):
        evicted += ring.add(rec(i, i * 10, "unit:a.service" if i % 2 else "unit:b.service"))
    assert len(ring) == 3
    assert [r.id for r in evicted] == [1, 2]
    assert ring.get(1) is None and ring.get(5) is not None
    assert [r.id for r in ring.keyed("unit:a.service")] == [5, 3]
    assert [r.id for r in ring.keyed("unit:b.service")] == [4]
    ring.add(rec(6, 60, "unit:b.service"))
    ring.add(rec(7, 70, "unit:b.service"))
    assert [r.id for r in ring.keyed("unit:a.service")] == [5]
    assert ring._index.keys() == {"unit:a.service", "unit:b.service"}


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=200), st.integers(1, 50),
       st.integers(0, 1000))
def test_time_bounded_walk_is_exact_with_out_of_order_times(
        stamps: list[int], capacity: int, since: int) -> None:
    ring = Ring(capacity)
    for i, ts in enumerate(stamps, start=1):
        ring.add(rec(i, ts, "k"))
    kept = stamps[-capacity:]
    expected = sorted(ts for ts in kept if ts > since)
    assert sorted(r.timestamp_usec for r in ring.newest(since) if r.timestamp_usec > since) == \
        expected
    assert sorted(r.timestamp_usec for r in ring.keyed("k", since)
                  if r.timestamp_usec > since) == expected
    listed = ring.listing(since, None, 5)
    assert [r.timestamp_usec for r in listed] == expected[-5:]


def test_listing_filters_kind_and_orders_by_time() -> None:
    ring = Ring(100)
    ring.add(rec(1, 50, kind="package"))
    ring.add(rec(2, 10, kind="dropin"))  # found late, older
    ring.add(rec(3, 30, kind="dropin"))
    assert [r.id for r in ring.listing(None, None, 10)] == [2, 3, 1]
    assert [r.id for r in ring.listing(None, "dropin", 10)] == [2, 3]
    assert [r.id for r in ring.listing(20, None, 1)] == [1]
    assert ring.listing(None, None, 0) == []
    # Followers use ids: an event recorded late with an old time is not missed.
    assert [r.id for r in ring.listing(None, None, 10, after_id=1)] == [2, 3]
    assert [r.id for r in ring.listing(40, None, 10, after_id=1)] == []


def test_retention_eviction() -> None:
    ring = Ring(100)
    for i in range(1, 5):
        ring.add(rec(i, i * 100, "k"))
    assert [r.id for r in ring.evict_before(250)] == [1, 2]
    assert [r.id for r in ring.keyed("k")] == [4, 3]


def test_select_takes_the_best_weight_and_the_window() -> None:
    ring = Ring(100)
    ring.add(rec(1, 100, "unit:a.service", "pkg:a"))
    ring.add(rec(2, 900, "unit:a.service"))
    ring.add(rec(3, 150, "kernel"))
    found = ring.select({"unit:a.service": 1.0, "pkg:a": 0.5, "kernel": 0.1}, 50, 500)
    assert set(found) == {1, 3}
    assert found[1][1] == 1.0 and found[1][2] == "unit:a.service"


def test_select_per_key_keeps_the_latest_on_each_side_of_the_failure() -> None:
    ring = Ring(1000)
    for i in range(1, 101):
        ring.add(rec(i, i * 10, "kernel"))
    found = ring.select({"kernel": 0.15}, 0, 10_000, pivot_usec=500, per_key=3)
    assert sorted(found) == [48, 49, 50, 98, 99, 100]
    # Ranked, the same three before the failure come first.
    assert [r.id for r, _ in rank(found, 500, 3)] == [50, 49, 48]


def test_ranking_prefers_relation_then_recency_and_before_over_after() -> None:
    failure = 10 * HOUR
    direct_old = rec(1, failure - 5 * HOUR)
    direct_new = rec(2, failure - 60 * 1_000_000)
    kernel = rec(3, failure - 1_000_000, kind="kernel")
    after = rec(4, failure + 1_000_000)
    found = {1: (direct_old, 1.0, "unit:x"), 2: (direct_new, 1.0, "unit:x"),
             3: (kernel, 0.15, "kernel"), 4: (after, 1.0, "unit:x")}
    ranked = [r.id for r, _ in rank(found, failure, 10)]
    assert ranked == [2, 1, 4, 3]
    assert [r.id for r, _ in rank(found, failure, 2)] == [2, 1]
    assert relevance(1.0, failure, failure) == 1.0
    assert 0 <= relevance(0.15, 0, failure) <= 1


def test_an_unrelated_event_never_outranks_a_direct_one_of_the_window() -> None:
    failure = 100 * HOUR
    rng = random.Random(7)
    for _ in range(200):
        direct = relevance(1.0, failure - rng.randrange(24 * HOUR), failure)
        kernel = relevance(0.15, failure - rng.randrange(1_000_000), failure)
        assert direct > kernel


def test_bucket_refills() -> None:
    bucket = Bucket(rate=10, burst=5, now=0.0)
    assert [bucket.take(0.0) for _ in range(6)] == [True] * 5 + [False]
    assert bucket.take(0.1)  # one token back after 0.1 s
    assert not bucket.take(0.1)
    assert all(bucket.take(10.0) for _ in range(5))
