"""Deterministic multi-criteria scores of (provider, model) candidates.

Every score is 0 to 100. The total is the weighted sum of speed, cost and
capability, times the provider's configured weight and a health factor;
ties go to the provider listed first in the configuration.
"""

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from syntrop.routerd.config import ProviderConfig

ALIASES = ("router:fast", "router:hard", "router:auto")

#: (speed, cost, capability) weights per intent.
WEIGHTS = {
    "fast": (0.6, 0.2, 0.2),
    "hard": (0.2, 0.1, 0.7),
    "model": (0.5, 0.3, 0.2),
}
#: Speed assumed before the first measurement, per tier.
TIER_SPEED = {"local": 90.0, "lan": 70.0, "remote": 50.0}
#: A latency of this many milliseconds scores 50 for speed.
LATENCY_REFERENCE_MS = 50.0
#: Prompts above this many tokens make router:auto a hard request.
HARD_PROMPT_TOKENS = 2000
EWMA_ALPHA = 0.3
COOLDOWN_S = 5.0
#: Characters of resident prefix (about 128 tokens) that count as one step
#: of affinity: a shorter match does not override the scores.
AFFINITY_STEP = 512
#: (provider, model) -> characters of the request's prefix resident there,
#: and whether it has room for a new prefix (None: it reports no cache).
Affinity = Callable[[str, str], tuple[int, bool | None]]


@dataclass(slots=True)
class Health:
    """Measured behaviour of one provider."""

    latency_ms: float | None = None
    tokens_per_s: float | None = None
    failures: int = 0
    cooling_until: float = 0.0
    requests: int = field(default=0)

    def status(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        if self.cooling_until > now:
            return "cooling"
        if self.requests == 0 or self.failures:
            return "unknown"  # never asked, or cooled down: the next request probes
        return "healthy"

    def success(self, latency_ms: float, tokens_per_s: float | None = None) -> None:
        self.requests += 1
        self.failures = 0
        self.cooling_until = 0.0
        self.latency_ms = latency_ms if self.latency_ms is None else (
            EWMA_ALPHA * latency_ms + (1 - EWMA_ALPHA) * self.latency_ms)
        if tokens_per_s is not None:
            self.tokens_per_s = tokens_per_s if self.tokens_per_s is None else (
                EWMA_ALPHA * tokens_per_s + (1 - EWMA_ALPHA) * self.tokens_per_s)

    def failure(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.failures += 1
        # 5 s, 10 s, 20 s ... at most 60 s.
        self.cooling_until = now + min(60.0, COOLDOWN_S * 2 ** (self.failures - 1))


@dataclass(slots=True)
class Breaker:
    """The circuit breaker of one (provider, model): closed while it works;
    open (cooling) for 5 s after a failure, doubled per consecutive failure
    up to 60 s; then half-open: one request at a time probes it, and its
    outcome closes or re-opens the breaker."""

    failures: int = 0
    open_until: float = 0.0
    probing: bool = False

    def state(self, now: float) -> str:
        if not self.failures:
            return "closed"
        return "open" if now < self.open_until else "half-open"

    def admits(self, now: float) -> bool:
        state = self.state(now)
        return state == "closed" or (state == "half-open" and not self.probing)

    def acquire(self, now: float) -> bool:
        """Take the way through; False when another request probes it."""
        if not self.admits(now):
            return False
        if self.failures:
            self.probing = True
        return True

    def release(self) -> None:
        """The request ended without a verdict (the client went away)."""
        self.probing = False

    def success(self) -> None:
        self.failures, self.open_until, self.probing = 0, 0.0, False

    def failure(self, now: float) -> None:
        self.failures += 1
        self.probing = False
        self.open_until = now + min(60.0, COOLDOWN_S * 2 ** (self.failures - 1))


@dataclass(frozen=True, slots=True)
class Scored:
    provider: str
    model: str
    score: float
    speed: float
    cost: float
    capability: float
    cooling: bool
    #: A local candidate demoted under memory pressure or without free slots.
    throttled: bool = False
    #: When a cooling candidate may be probed again (monotonic seconds).
    retry_at: float = 0.0
    #: Characters of the request's chat prefix resident there (affinity.py).
    prefix_chars: int = 0
    #: Its KV cache has no room for a new prefix while another's has.
    cache_full: bool = False


def intent(model: str, prompt_tokens: int | None) -> str:
    if model == "router:fast":
        return "fast"
    if model == "router:hard":
        return "hard"
    if model == "router:auto":
        return "hard" if (prompt_tokens or 0) > HARD_PROMPT_TOKENS else "fast"
    return "model"


def speed_score(provider: ProviderConfig, health: Health) -> float:
    if health.latency_ms is None:
        return TIER_SPEED.get(provider.tier, 50.0)
    return 100.0 * LATENCY_REFERENCE_MS / (LATENCY_REFERENCE_MS + health.latency_ms)


def cost_score(provider: ProviderConfig) -> float:
    """cost is in currency units per million tokens; free scores 100."""
    return 100.0 / (1.0 + provider.cost)


def candidates(
    model: str,
    providers: tuple[ProviderConfig, ...],
    health: dict[str, Health],
    prompt_tokens: int | None = None,
    now: float | None = None,
    breakers: dict[tuple[str, str], Breaker] | None = None,
    throttle_local: bool = False,
    full: frozenset[str] = frozenset(),
    affinity: Affinity | None = None,
    home: str | None = None,
    node_of: Callable[[str], str] | None = None,
) -> list[Scored]:
    """Candidates for `model` (a model or an alias), best first: those a
    breaker lets through before cooling ones, and under `throttle_local`
    (memory pressure, no free slots) local ones after the LAN and remote
    tiers; so are the providers in `full` (fleet members that published no
    free slot). Within each of those groups, with `affinity`, the longer
    the request's resident prefix (in AFFINITY_STEP characters) the
    earlier; then a candidate whose cache has no room for a new prefix
    after those that have; then, with `home` (a key of the request's
    prefix), the candidates that report a cache in the order rendezvous
    hashing of `home` over their nodes gives them (`node_of`: a provider's
    node id; without it, the provider's own id), so that each prefix has
    the same home whichever node routes it and new ones spread over the
    fleet. Cooling candidates stay in the list so that the caller can wait
    for the earliest `retry_at`."""
    now = time.monotonic() if now is None else now
    kind = intent(model, prompt_tokens)
    ws, wc, wcap = WEIGHTS[kind]
    found: list[tuple[int, float, bool, int, bool | None, Scored]] = []
    for order, provider in enumerate(providers):
        if prompt_tokens is not None and prompt_tokens > provider.context_window:
            continue
        state = health.get(provider.id) or Health()
        models = provider.models if kind != "model" else (
            (model,) if model in provider.models else ())
        for name in models:
            speed = round(speed_score(provider, state), 1)
            cost = round(cost_score(provider), 1)
            capability = round(provider.capability, 1)
            breaker = breakers.get((provider.id, name)) if breakers is not None else None
            if breaker is None:
                cooling = state.status(now) == "cooling"
                retry_at = state.cooling_until
            else:
                cooling = not breaker.admits(now)
                retry_at = breaker.open_until
            throttled = (throttle_local and provider.tier == "local") or provider.id in full
            total = provider.weight * (ws * speed + wc * cost + wcap * capability)
            chars, room = affinity(provider.id, name) if affinity is not None else (0, None)
            found.append((order, total, throttled, chars, room, Scored(
                provider.id, name, round(total, 1), speed, cost, capability, cooling,
                throttled, retry_at, chars)))
    # A cache without room comes later only where another has room.
    roomy = any(room for *_, room, _ in found)
    result = []
    for order, total, throttled, chars, room, scored in found:
        no_room = roomy and room is False
        if no_room:
            scored = dataclasses.replace(scored, cache_full=True)
        node = node_of(scored.provider) if node_of is not None else scored.provider
        rank = _rendezvous(home, node) if home and room is not None else ""
        result.append((scored.cooling, throttled, -(chars // AFFINITY_STEP), no_room,
                       rank or "~", -total, order, scored))
    result.sort(key=lambda item: item[:7])
    return [item[7] for item in result]


def homes(key: str, nodes: Iterable[str], busy: Collection[str] = ()) -> list[str]:
    """The nodes in the order they are home to prefix `key`: rendezvous
    hashing of `key` over their ids, the `busy` ones (no free slot, or a
    queue over the bound) after the others in the same order. Every node
    that knows the same members computes the same list; the first is the
    home, the next the overflow home. `candidates` orders by the same."""
    return sorted(set(nodes), key=lambda node: (node in busy, _rendezvous(key, node)))


def _rendezvous(key: str, node: str) -> str:
    from syntrop.system.digest import sha256  # not hashlib: it maps libcrypto

    return str(sha256(f"{key}\0{node}".encode()).hexdigest())
