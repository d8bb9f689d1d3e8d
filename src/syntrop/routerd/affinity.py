"""Prefix affinity: which provider holds a conversation's start in its KV
cache, and which has room for a new one.

runtimed reports, per model, the digests of the chat prefixes its idle
contexts hold and how many contexts hold one (Runtime1.GetLoad, see
syntrop/prefix.py); a fleet node publishes its runtimed's report in its
etcd record. routerd computes the same digest chain from a request, as it
would send it, and scoring puts first the provider holding its longest
prefix (Dynamo's KV-aware routing, on chat turns instead of token blocks).
A request whose start is resident nowhere goes, among the providers that
report a cache, to one with room for it, so that new prefixes spread over
the fleet instead of evicting each other on the best-scored node.

Reports lag (runtimed's load is read once a second, fleet records are
published at most every publish_interval), so routerd also remembers where
it sent each chain for PREDICT_S seconds: the next request of the same
conversation finds it before any report says so.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from syntrop.prefix import matched

#: Seconds routerd trusts its own routing decisions over the reports.
PREDICT_S = 10.0
#: Chains remembered per (provider, model).
PREDICT_MAX = 256


@dataclass(frozen=True, slots=True)
class Cache:
    """One provider's report for one model."""

    prefixes: frozenset[str]
    #: Contexts holding a prefix, and how many it may have (its slots).
    contexts: int
    capacity: int
    at: float = 0.0


@dataclass(slots=True)
class Affinity:
    #: (provider, model) -> its last report.
    caches: dict[tuple[str, str], Cache] = field(default_factory=dict)
    #: (provider, model) -> deepest digest of a chain sent there -> (all its
    #: digests, when).
    sent: dict[tuple[str, str], dict[str, tuple[frozenset[str], float]]] = \
        field(default_factory=dict)

    def report(self, provider: str, model: str, prefixes: Sequence[str], contexts: int,
               capacity: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.caches[(provider, model)] = Cache(frozenset(prefixes), contexts, capacity, now)

    def forget(self, provider: str) -> None:
        """`provider` is gone (a fleet member left): its reports too."""
        for key in [k for k in self.caches if k[0] == provider]:
            del self.caches[key]
        for key in [k for k in self.sent if k[0] == provider]:
            del self.sent[key]

    def knows(self, model: str) -> bool:
        """Whether any provider reports a cache for `model` (else a request's
        chain need not be computed)."""
        return any(m == model for _, m in self.caches)

    def routed(self, provider: str, model: str, chain: Sequence[tuple[str, int]],
               now: float | None = None) -> None:
        """A request of `chain` was sent to (provider, model)."""
        if not chain:
            return
        now = time.monotonic() if now is None else now
        sent = self.sent.setdefault((provider, model), {})
        sent.pop(chain[-1][0], None)
        sent[chain[-1][0]] = (frozenset(d for d, _ in chain), now)
        if len(sent) > PREDICT_MAX:
            del sent[next(iter(sent))]

    def match(self, provider: str, model: str, chain: Sequence[tuple[str, int]],
              now: float | None = None) -> tuple[int, bool | None]:
        """Characters of `chain`'s longest prefix (provider, model) holds, and
        whether it has room for another prefix (None: it reports no cache)."""
        now = time.monotonic() if now is None else now
        cache = self.caches.get((provider, model))
        resident: set[str] = set(cache.prefixes) if cache is not None else set()
        pending = 0  # chains sent since its report, not in it
        for deepest, (digests, at) in list(self.sent.get((provider, model), {}).items()):
            if now - at > PREDICT_S:
                del self.sent[(provider, model)][deepest]
                continue
            resident |= digests
            if cache is not None and at > cache.at and deepest not in cache.prefixes:
                pending += 1
        room = None if cache is None else cache.contexts + pending < cache.capacity
        return matched(chain, resident), room
