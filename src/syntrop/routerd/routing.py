"""Which provider answers: candidates scored (scoring.py) with prefix
affinity, breakers and offload, cooling ones waited for within the
request's deadline; each attempt's outcome counted."""

import asyncio
import time
from collections.abc import Sequence

from syntrop.routerd import scoring
from syntrop.routerd.api import PROMPT_FIELDS, Response, error
from syntrop.routerd.offload import Offload
from syntrop.routerd.registry import Registry


class Router:
    """Candidates for a request, best first, and the bookkeeping of each
    attempt on one (breakers, health, the counters /metrics shows)."""

    def __init__(self, registry: Registry, offload: Offload) -> None:
        self.registry, self.offload = registry, offload
        self.routing_errors = 0
        #: (provider, outcome) -> attempts, for /metrics.
        self.attempts: dict[tuple[str, str], int] = {}

    def route(self, model: str, prompt_tokens: int | None = None,
              now: float | None = None, chain: Sequence[tuple[str, int]] = (),
              forwarded: bool = False) -> list[scoring.Scored]:
        """The candidates for `model`, best first; with a chat's prefix
        `chain` (syntrop.prefix), by affinity too. A `forwarded` request
        (another node's) is served here: no LAN candidates, no loops."""
        registry = self.registry
        providers = registry.effective()
        if forwarded:
            providers = tuple(p for p in providers if p.tier != "lan")
        affinity: scoring.Affinity | None = None
        if chain:
            def affinity(provider: str, name: str) -> tuple[int, bool | None]:
                return registry.affinity.match(provider, name, chain, now)
        # A prefix worth keeping has a home: its first turn's digest says where.
        home = chain[0][0] if chain and chain[-1][1] >= scoring.AFFINITY_STEP else None
        return scoring.candidates(model, providers, registry.health, prompt_tokens, now,
                                  registry.breakers, self.offload.throttled(),
                                  self.offload.busy(registry.fleet_full),
                                  affinity, home, registry.node_of)

    def chain(self, turns: Sequence[tuple[str, str]] | None,
              model: str) -> list[tuple[str, int]]:
        """A chat's prefix chain, from its turns (a Request's: None for
        other endpoints), when some provider of `model` reports its cache
        (else routing has no use for it)."""
        if not turns or not self.registry.affinity.knows(model):
            return []
        from syntrop.prefix import chain

        return chain(turns)

    def breaker(self, candidate: scoring.Scored) -> scoring.Breaker:
        key = (candidate.provider, candidate.model)
        breaker = self.registry.breakers.get(key)
        if breaker is None:
            breaker = self.registry.breakers[key] = scoring.Breaker()
        return breaker

    def succeeded(self, candidate: scoring.Scored, latency_ms: float) -> None:
        self.breaker(candidate).success()
        health = self.registry.health.get(candidate.provider)
        if health is not None:
            health.success(latency_ms)
        self._count(candidate.provider, "ok")

    def failed(self, candidate: scoring.Scored) -> None:
        self.breaker(candidate).failure(time.monotonic())
        health = self.registry.health.get(candidate.provider)
        if health is not None:
            health.failure()
        self._count(candidate.provider, "failed")

    def release(self, candidate: scoring.Scored) -> None:
        self.breaker(candidate).release()

    def ended(self, provider: str) -> None:
        """A request to `provider` ended."""
        self.offload.ended_at[provider] = time.time()

    def _count(self, provider: str, outcome: str) -> None:
        key = (provider, outcome)
        self.attempts[key] = self.attempts.get(key, 0) + 1

    def _too_long(self, endpoint: str, model: str, tokens: int,
                  forwarded: bool) -> Response | None:
        """400 when providers serve `model` but the prompt (estimated at
        four characters a token) is over every one's context window."""
        serving = {s.provider for s in self.route(model, None, forwarded=forwarded)}
        windows = [p.context_window for p in self.registry.effective() if p.id in serving]
        if not windows or tokens <= max(windows):
            return None
        return error(400, f"this model's maximum context length is {max(windows)} tokens; "
                     f"the prompt is about {tokens} (estimated at four characters a token)",
                     "context_length_exceeded", PROMPT_FIELDS.get(endpoint, "messages"))

    async def usable(self, endpoint: str, model: str, tokens: int, deadline: float,
                     chain: Sequence[tuple[str, int]] = (), forwarded: bool = False,
                     ) -> list[scoring.Scored] | Response:
        """The candidates a breaker lets through, best first. When every
        one is cooling, wait for the earliest to reopen, within the
        request's deadline."""
        while True:
            now = time.monotonic()
            scored = self.route(model, tokens, now, chain, forwarded)
            if not scored and (too_long := self._too_long(endpoint, model, tokens, forwarded)):
                return too_long
            if not scored and await self.registry.rediscover():
                continue  # pulled since the last look, perhaps
            if not scored:
                self.routing_errors += 1
                return error(404, f"the model {model!r} does not exist", "model_not_found",
                             "model")
            usable = [s for s in scored if not s.cooling]
            if usable:
                return usable
            # A probe in flight (half-open) reopens nothing by time: look again soon.
            wake = max(min(s.retry_at for s in scored), now + 0.05)
            if wake > deadline:
                self.routing_errors += 1
                return error(503, f"every provider of {model!r} is cooling down after "
                             "failures; try again later", "providers_cooling")
            await asyncio.sleep(wake - now)
