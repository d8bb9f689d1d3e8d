"""The timeline: a bounded ring of events, indexed for GetUnitContext, and
the ranking of what it returns. Pure: no I/O, no clock (callers pass times).

Ordering. Events get increasing ids as they are recorded, but their
timestamps need not increase: a file found changed at start-up carries its
modification time, a package log read late carries the log's times. Each
record keeps `horizon`, the largest timestamp recorded up to and including
it; walking from the newest backwards, once `horizon` is below a bound no
older record can be above it, so time-bounded queries stop early and stay
exact.

Bounds. At most `capacity` records; the oldest recorded goes first. The
index holds ids per key and loses them with their records.
"""

import collections
import heapq
import itertools
from collections.abc import Iterator, Reversible
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One event as the timeline keeps it (the diff stays on disk)."""

    id: int
    timestamp_usec: int
    kind: str
    action: str
    summary: str
    unit: str | None = None
    path: str | None = None
    package: str | None = None
    mode: int | None = None
    pid: int | None = None
    comm: str | None = None
    has_diff: bool = False
    keys: tuple[str, ...] = ()
    horizon: int = field(default=0, compare=False)


class Ring:
    """A bounded, indexed sequence of records in the order recorded."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._records: collections.deque[Record] = collections.deque()
        self._by_id: dict[int, Record] = {}
        self._index: dict[str, collections.deque[Record]] = {}
        self._horizon = 0

    def __len__(self) -> int:
        return len(self._records)

    @property
    def last_id(self) -> int:
        return self._records[-1].id if self._records else 0

    def add(self, record: Record) -> list[Record]:
        """Append `record` (its id above every other); the records evicted."""
        assert record.id > self.last_id, "ids must increase"
        self._horizon = max(self._horizon, record.timestamp_usec)
        object.__setattr__(record, "horizon", self._horizon)
        self._records.append(record)
        self._by_id[record.id] = record
        for key in record.keys:
            self._index.setdefault(key, collections.deque()).append(record)
        evicted = []
        while len(self._records) > self.capacity:
            evicted.append(self._evict())
        return evicted

    def _evict(self) -> Record:
        old = self._records.popleft()
        del self._by_id[old.id]
        for key in old.keys:
            bucket = self._index.get(key)
            if bucket and bucket[0] is old:
                bucket.popleft()
                if not bucket:
                    del self._index[key]
        return old

    def evict_before(self, timestamp_usec: int) -> list[Record]:
        """Drop records older than the retention, oldest recorded first, as
        long as the oldest is older (a late old record waits its turn)."""
        evicted = []
        while self._records and self._records[0].timestamp_usec < timestamp_usec:
            evicted.append(self._evict())
        return evicted

    def get(self, event_id: int) -> Record | None:
        return self._by_id.get(event_id)

    def newest(self, since_usec: int | None = None) -> Iterator[Record]:
        """Records newest-recorded first, stopping once none left can be
        after `since_usec`."""
        return _walk(self._records, since_usec)

    def keyed(self, key: str, since_usec: int | None = None) -> Iterator[Record]:
        return _walk(self._index.get(key, ()), since_usec)

    def select(self, keys: dict[str, float], since_usec: int, until_usec: int, *,
               pivot_usec: int | None = None, per_key: int = 20_000
               ) -> dict[int, tuple[Record, float, str]]:
        """Records within [since, until] under any of `keys`: id → (record,
        best weight, the key that gave it). Within one key all records weigh
        the same, so only the `per_key` latest on each side of `pivot_usec`
        (the failure) can rank: the walk stops once it has them. (The walk
        is in the order recorded, which follows time except for events found
        late, e.g. at start-up; such an event may take a slot.)"""
        pivot = until_usec if pivot_usec is None else pivot_usec
        found: dict[int, tuple[Record, float, str]] = {}
        for key, weight in keys.items():
            before = after = 0
            for record in self.keyed(key, since_usec):
                if not since_usec <= record.timestamp_usec <= until_usec:
                    continue
                if record.timestamp_usec <= pivot:
                    before += 1
                    if before > per_key:
                        if after >= per_key:
                            break
                        continue
                else:
                    after += 1
                    if after > per_key:
                        if before >= per_key:
                            break
                        continue
                best = found.get(record.id)
                if best is None or weight > best[1]:
                    found[record.id] = (record, weight, key)
        return found

    def listing(self, since_usec: int | None, kind: str | None, limit: int, *,
                after_id: int | None = None) -> list[Record]:
        """The newest `limit` records (by time) after `since_usec`, of `kind`,
        recorded after `after_id`; oldest first."""
        records = self.newest(since_usec)
        if after_id is not None:
            records = itertools.takewhile(lambda r: r.id > after_id, records)
        chosen = (
            r for r in records
            if (since_usec is None or r.timestamp_usec > since_usec)
            and (kind is None or r.kind == kind)
        )
        newest = heapq.nlargest(limit, chosen, key=lambda r: (r.timestamp_usec, r.id))
        newest.reverse()
        return newest


def _walk(records: Reversible[Record], since_usec: int | None) -> Iterator[Record]:
    for record in reversed(records):
        if since_usec is not None and record.horizon < since_usec:
            return
        yield record


# ranking -------------------------------------------------------------------

HOUR_USEC = 3600 * 1_000_000


def relevance(weight: float, timestamp_usec: int, failure_usec: int) -> float:
    """Weight of the relation, scaled by time: a change just before the
    failure counts most, one from hours before less, one after the failure
    (it cannot have caused it) least. Always within [0, 1]."""
    if timestamp_usec <= failure_usec:
        age_hours = (failure_usec - timestamp_usec) / HOUR_USEC
        recency = 0.5 + 0.5 / (1.0 + age_hours)
    else:
        recency = 0.25
    return round(max(0.0, min(1.0, weight * recency)), 4)


def rank(found: dict[int, tuple[Record, float, str]], failure_usec: int,
         limit: int) -> list[tuple[Record, float]]:
    """The `limit` most relevant, most relevant first; ties: newest first."""
    scored = [(record, relevance(weight, record.timestamp_usec, failure_usec))
              for record, weight, _ in found.values()]
    return heapq.nsmallest(limit, scored, key=lambda x: (-x[1], -x[0].timestamp_usec, -x[0].id))


# flood control -------------------------------------------------------------


class Bucket:
    """A token bucket: `rate` events per second, bursts of `burst`."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float) -> bool:
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
