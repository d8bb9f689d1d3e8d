"""routerd's gateway: routing (scores, prefix affinity, breakers, offload,
admission), retry before the first token, the endpoints, and the counters
/metrics shows. The OpenAI shapes and checks are api.py's; a stream's relay
and its continuation mid-answer, relay.py's. Transport-free: http.py feeds
it requests."""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from syntrop.config import Paths
from syntrop.routerd import scoring
from syntrop.routerd.affinity import Affinity
from syntrop.routerd.api import (
    ENDPOINTS,
    PROMPT_FIELDS,
    BadRequest,
    Response,
    check,
    error,
    ok,
    parse,
    prompt_tokens,
    served_by,
)
from syntrop.routerd.config import Config, ProviderConfig
from syntrop.routerd.pressure import Pressure
from syntrop.routerd.providers import REGISTRY, Provider, ProviderError
from syntrop.routerd.queues import USER, Admission
from syntrop.routerd.relay import CONTINUATION, Opened, Relay

logger = logging.getLogger(__name__)

#: Seconds between two looks at runtimed's free slots.
LOAD_INTERVAL = 1.0
#: Seconds between two asks for a LAN peer's advertisement.
ADVERTISE_INTERVAL = 5.0
#: Seconds a provider's model list may take at start and Reload.
DISCOVERY_TIMEOUT = 5.0
#: Least seconds between two asks for the model lists of providers that
#: have no configured list (a model pulled since is served without Reload).
REDISCOVER_INTERVAL = 2.0
#: Seconds the start-up round of discovery waits, unless a request needs
#: it sooner: the first reply of a cold start (a Varlink call, /health)
#: goes out before the provider clients are imported and asked.
START_DISCOVERY_DELAY = 0.2
#: Where rerank is asked for (llama-server's four spellings).
RERANK_PATHS = frozenset({"/v1/rerank", "/rerank", "/v1/reranking", "/reranking"})


class Gateway:
    def __init__(self, config: Config, paths: Paths,
                 pressure: Pressure | None = None) -> None:
        self.paths = paths
        self.health: dict[str, scoring.Health] = {}
        self.breakers: dict[tuple[str, str], scoring.Breaker] = {}
        self.requests_total = 0
        self.routing_errors = 0
        self.continuations = 0
        #: (endpoint path, status) -> answers, for /metrics.
        self.answered: dict[tuple[str, int], int] = {}
        #: (provider, outcome) -> attempts, for /metrics.
        self.attempts: dict[tuple[str, str], int] = {}
        self.discovered: dict[str, tuple[str, ...]] = {}
        self._discovered_at = float("-inf")
        self._discovering: asyncio.Task[None] | None = None
        self._needed: asyncio.Event | None = None  # set: a request waits for the round
        self.pressure = pressure or Pressure(config.psi_threshold, path=config.psi_file)
        #: runtimed providers without a free slot at the last look, and when
        #: they were looked at (epoch seconds).
        self.full: dict[str, float] = {}
        #: When a request to each provider last ended (epoch seconds): a
        #: "no free slot" seen before it may have been that request's own.
        self.ended_at: dict[str, float] = {}
        #: runtimed providers' free slots at the last look (None: unknown).
        self.free_slots: dict[str, int | None] = {}
        #: runtimed providers' requests waiting for a slot at the last look.
        self.queued: dict[str, int] = {}
        self._load_at = float("-inf")
        self._tasks: set[asyncio.Task[None]] = set()
        self._effective: tuple[object, object, tuple[ProviderConfig, ...]] = (None, None, ())
        #: The other nodes of the fleet, as peer providers (fleet.py sets them).
        self.fleet: tuple[ProviderConfig, ...] = ()
        self._fleet_seen: object = None
        self.fleet_full: dict[str, float] = {}
        #: Which provider holds which chat prefix (affinity.py).
        self.affinity = Affinity()
        #: Called when a request ends (the fleet publishes the load anew).
        self.changed: Callable[[], None] = lambda: None
        self.apply(config)

    def apply(self, config: Config) -> None:
        """Switch to `config`; requests in flight keep their providers."""
        self.config = config
        self.pressure.threshold, self.pressure.path = config.psi_threshold, config.psi_file
        self.admission = Admission(config.max_inflight, config.triage_reserved)
        self.providers: dict[str, Provider] = {
            p.id: REGISTRY[p.kind](p, self.paths) for p in config.providers}
        self.health = {p.id: self.health.get(p.id) or scoring.Health()
                       for p in config.providers}
        fleet, self.fleet = self.fleet, ()
        self.set_fleet(fleet)

    def set_fleet(self, members: tuple[ProviderConfig, ...],
                  full: dict[str, float] | None = None,
                  caches: tuple[tuple[str, str, list[str], int, int], ...] = ()) -> None:
        """The fleet's other nodes now (from etcd): new ones become peer
        providers, gone ones are dropped, unchanged ones keep their
        connections, health and breakers. `full`: those that published no
        free slot, throttled like a full local runtimed. `caches`: what
        their runtimed holds, as (provider, model, prefixes, contexts,
        capacity)."""
        self.fleet_full = full or {}
        before = {p.id: p for p in self.fleet}
        for member in before.values():
            self.affinity.forget(member.id)
            if member not in members:
                self.providers.pop(member.id, None)
                self.health.pop(member.id, None)
        for provider, model, prefixes, contexts, capacity in caches:
            self.affinity.report(provider, model, prefixes, contexts, capacity)
        for member in members:
            if before.get(member.id) != member:
                self.providers[member.id] = REGISTRY[member.kind](member, self.paths)
                self.health[member.id] = self.health.get(member.id) or scoring.Health()
        self.fleet = members

    async def discover(self) -> None:
        """Ask providers configured without a model list for theirs (one
        that does not answer keeps the list it gave last). Callers at the
        same time share one round: a request that finds no model while
        routerd starts waits for the lists rather than being told 404."""
        if self._discovering is None or self._discovering.done():
            self._discovered_at = time.monotonic()
            self._discovering = asyncio.get_running_loop().create_task(self._discover())
        if self._needed is not None:
            self._needed.set()
        await asyncio.shield(self._discovering)

    async def _discover(self, delay: float = 0.0) -> None:
        if delay:
            self._needed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._needed.wait()
            self._needed = None
        found: dict[str, tuple[str, ...]] = {}
        for config in self.config.providers:
            if config.models:
                continue
            try:
                models = await asyncio.wait_for(
                    self.providers[config.id].list_models(), DISCOVERY_TIMEOUT)
            except (ProviderError, TimeoutError) as failure:
                logger.warning("provider %s: no model list: %s", config.id, failure)
                if config.id in self.discovered:
                    found[config.id] = self.discovered[config.id]
                continue
            found[config.id] = tuple(models)
        if found != self.discovered:
            self.discovered = found

    def start_discovery(self, delay: float = START_DISCOVERY_DELAY) -> None:
        """Begin a round of `discover` without waiting for it, in `delay`
        seconds or as soon as a request waits for it."""
        self._discovered_at = time.monotonic()
        self._discovering = asyncio.get_running_loop().create_task(self._discover(delay))

    async def rediscover(self) -> bool:
        """Discover again, at most once per REDISCOVER_INTERVAL (or wait for
        the round in flight), when some provider's models are asked rather
        than configured; whether it looked."""
        if all(p.models for p in self.config.providers):
            return False
        if self._discovering is not None and not self._discovering.done():
            if self._needed is not None:
                self._needed.set()
            await asyncio.shield(self._discovering)
            return True
        if time.monotonic() - self._discovered_at < REDISCOVER_INTERVAL:
            return False
        await self.discover()
        return True

    def effective(self) -> tuple[ProviderConfig, ...]:
        """The providers with their model lists, configured or discovered
        (remade only when the configuration or a discovered list changed)."""
        key = (self.config, self.discovered)
        if self._effective[0] is not key[0] or self._effective[1] is not key[1] or \
                self._fleet_seen is not self.fleet:
            from dataclasses import replace

            self._fleet_seen = self.fleet
            self._effective = (*key, tuple(
                p if p.models else replace(p, models=self.discovered.get(p.id, ()))
                for p in self.config.providers) + self.fleet)
        return self._effective[2]

    def local_models(self) -> list[str]:
        """The models this node's own providers serve (what it advertises
        to the fleet: not what it routes to other nodes)."""
        fleet = {p.id for p in self.fleet}
        return sorted({m for p in self.effective() if p.id not in fleet and p.tier == "local"
                       for m in p.models})

    def models(self) -> list[tuple[str, str]]:
        """(model, provider) pairs, each model once, in configuration order."""
        seen: dict[str, str] = {}
        for provider in self.effective():
            for model in provider.models:
                seen.setdefault(model, provider.id)
        return list(seen.items())

    def default_model(self) -> str | None:
        if self.config.default_model:
            return self.config.default_model
        models = self.models()
        return models[0][0] if models else None

    # offload ----------------------------------------------------------------

    def throttled(self) -> bool:
        """Local work is throttled: memory pressure over the threshold, or a
        local runtimed without a free slot."""
        self._look_at_load()
        self._look_at_peers()
        return self.pressure.high() or bool(self._busy(self.full))

    def _busy(self, full: dict[str, float]) -> frozenset[str]:
        """Of providers seen without a free slot, those seen so after our
        last request to them ended (else the slot was likely its own)."""
        return frozenset(p for p, at in full.items()
                         if at > self.ended_at.get(p, float("-inf")))

    def ended(self, provider: str) -> None:
        """A request to `provider` ended."""
        self.ended_at[provider] = time.time()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work)
        except RuntimeError:  # no loop: a synchronous caller
            work.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def look_at_peers(self) -> None:
        """Ask every LAN peer for its advertisement now, in the background."""
        for peer in self.providers.values():
            if hasattr(peer, "advertised_at"):
                peer.advertised_at = float("-inf")
        self._look_at_peers()

    def _look_at_peers(self) -> None:
        now = time.monotonic()
        stale = [p for p in self.providers.values()
                 if now - getattr(p, "advertised_at", now) >= ADVERTISE_INTERVAL]
        for peer in stale:
            peer.advertised_at = now  # type: ignore[attr-defined]
        if stale:
            self._spawn(self.advertise(stale))

    async def advertise(self, peers: list[Provider] | None = None) -> None:
        """Ask LAN peers for their health, RTT and free accelerator memory;
        a peer that fails opens the breakers of its models."""
        if peers is None:
            peers = [p for p in self.providers.values() if hasattr(p, "advertise")]
        for peer in peers:
            try:
                await asyncio.wait_for(peer.advertise(), DISCOVERY_TIMEOUT)  # type: ignore[attr-defined]
                if not peer.config.models and peer.config.id not in self.discovered:
                    # Unreachable at start or Reload, back now: its models.
                    models = await asyncio.wait_for(peer.list_models(), DISCOVERY_TIMEOUT)
                    self.discovered = {**self.discovered, peer.config.id: tuple(models)}
            except (ProviderError, TimeoutError) as failure:
                logger.warning("peer %s: %s", peer.config.id, failure or "no answer in time")
                now = time.monotonic()
                if peer.config.id in self.health:
                    self.health[peer.config.id].failure(now)
                for config in self.effective():
                    if config.id == peer.config.id:
                        for model in config.models:
                            self.breakers.setdefault((config.id, model),
                                                     scoring.Breaker()).failure(now)

    async def refresh_load(self) -> None:
        """Ask every local runtimed for its load now."""
        self._load_at = time.monotonic()
        await self._refresh_load([p for p in self.config.providers if p.kind == "runtimed"])

    def _look_at_load(self) -> None:
        """Refresh runtimed's free slots in the background, once a second at
        most; routing uses the last answer and never waits for it."""
        now = time.monotonic()
        if now - self._load_at < LOAD_INTERVAL:
            return
        locals_ = [p for p in self.config.providers if p.kind == "runtimed"]
        if not locals_:
            return
        self._load_at = now
        self._spawn(self._refresh_load(locals_))

    async def _refresh_load(self, locals_: list[ProviderConfig]) -> None:
        for config in locals_:
            provider = self.providers.get(config.id)
            probe = getattr(provider, "load", None)
            asked = time.time()
            load = await probe() if probe is not None else None
            free = None if load is None else int(load["free_slots"])
            self.free_slots[config.id] = free
            self.queued[config.id] = int(load.get("queue_depth") or 0) if load else 0
            if load is not None:
                self._report_caches(config.id, load)
            if free == 0 or self._over_queue(self.queued[config.id]):
                self.full[config.id] = asked
            else:
                self.full.pop(config.id, None)

    def _over_queue(self, queued: int) -> bool:
        """In a fleet, a runtimed with more requests waiting than
        [fleet] queue_bound counts as full: its prefixes overflow to their
        next home."""
        return bool(self.config.fleet.etcd) and queued > self.config.fleet.queue_bound

    def _report_caches(self, provider: str, load: Any) -> None:
        """What a runtimed's load says its KV caches hold, per model it
        serves: a model not loaded, or without a chat yet, holds nothing
        and has every slot's room."""
        loaded = {m.name: m for m in load.get("models") or ()}
        served = next((p.models for p in self.effective() if p.id == provider), ())
        for name in {*served, *loaded}:
            model = loaded.get(name)
            self.affinity.report(provider, name, (model.prefixes or []) if model else [],
                                 (model.cached_contexts or 0) if model else 0,
                                 int(load["total_slots"]))

    # routing ----------------------------------------------------------------

    def route(self, model: str, prompt_tokens: int | None = None,
              now: float | None = None, chain: Sequence[tuple[str, int]] = (),
              forwarded: bool = False) -> list[scoring.Scored]:
        """The candidates for `model`, best first; with a chat's prefix
        `chain` (syntrop.prefix), by affinity too. A `forwarded` request
        (another node's) is served here: no LAN candidates, no loops."""
        providers = self.effective()
        if forwarded:
            providers = tuple(p for p in providers if p.tier != "lan")
        affinity: scoring.Affinity | None = None
        if chain:
            def affinity(provider: str, name: str) -> tuple[int, bool | None]:
                return self.affinity.match(provider, name, chain, now)
        # A prefix worth keeping has a home: its first turn's digest says where.
        home = chain[0][0] if chain and chain[-1][1] >= scoring.AFFINITY_STEP else None
        return scoring.candidates(model, providers, self.health, prompt_tokens, now,
                                  self.breakers, self.throttled(), self._busy(self.fleet_full),
                                  affinity, home, self.node_of)

    def node_of(self, provider: str) -> str:
        """The fleet node `provider` runs on: a member's node id, this node's
        for its own (local) providers; other providers are their own."""
        if provider.startswith("fleet:") and any(p.id == provider for p in self.fleet):
            return provider.removeprefix("fleet:")
        local = any(p.id == provider and p.tier == "local" for p in self.config.providers)
        return self.config.fleet.node if local and self.config.fleet.node else provider

    def chain(self, endpoint: str, request: dict[str, Any],
              model: str) -> list[tuple[str, int]]:
        """A chat request's prefix chain, when some provider of `model`
        reports its cache (else routing has no use for it)."""
        if endpoint != "chat/completions" or not self.affinity.knows(model):
            return []
        from syntrop.prefix import chain
        from syntrop.routerd.providers.runtimed import turns

        found = turns({**request, "model": model})
        return chain(found) if found else []

    def _breaker(self, candidate: scoring.Scored) -> scoring.Breaker:
        key = (candidate.provider, candidate.model)
        breaker = self.breakers.get(key)
        if breaker is None:
            breaker = self.breakers[key] = scoring.Breaker()
        return breaker

    def succeeded(self, candidate: scoring.Scored, latency_ms: float) -> None:
        self._breaker(candidate).success()
        health = self.health.get(candidate.provider)
        if health is not None:
            health.success(latency_ms)
        self._count(candidate.provider, "ok")

    def failed(self, candidate: scoring.Scored) -> None:
        self._breaker(candidate).failure(time.monotonic())
        health = self.health.get(candidate.provider)
        if health is not None:
            health.failure()
        self._count(candidate.provider, "failed")

    def release(self, candidate: scoring.Scored) -> None:
        self._breaker(candidate).release()

    def _count(self, provider: str, outcome: str) -> None:
        key = (provider, outcome)
        self.attempts[key] = self.attempts.get(key, 0) + 1

    def _too_long(self, endpoint: str, model: str, tokens: int,
                  forwarded: bool) -> Response | None:
        """400 when providers serve `model` but the prompt (estimated at
        four characters a token) is over every one's context window."""
        serving = {s.provider for s in self.route(model, None, forwarded=forwarded)}
        windows = [p.context_window for p in self.effective() if p.id in serving]
        if not windows or tokens <= max(windows):
            return None
        return error(400, f"this model's maximum context length is {max(windows)} tokens; "
                     f"the prompt is about {tokens} (estimated at four characters a token)",
                     "context_length_exceeded", PROMPT_FIELDS.get(endpoint, "messages"))

    async def _usable(self, endpoint: str, model: str, tokens: int, deadline: float,
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
            if not scored and await self.rediscover():
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

    # requests ---------------------------------------------------------------

    async def handle(self, method: str, path: str, body: bytes,
                     traffic: str = USER, forwarded: bool = False) -> Response:
        """One request; `forwarded`: another node of the fleet sent it (it
        is served by this node's own providers)."""
        path = path.partition("?")[0]
        response = await self._handle(method, path, body, traffic, forwarded)
        known = path in ENDPOINTS or path in RERANK_PATHS or \
            path in ("/v1/models", "/health", "/v1/messages")
        key = ("/v1/models/{id}" if path.startswith("/v1/models/") else
               path if known else "other",
               response.status)
        self.answered[key] = self.answered.get(key, 0) + 1
        return response

    async def _handle(self, method: str, path: str, body: bytes, traffic: str,
                      forwarded: bool) -> Response:
        if path == "/health":  # also what LAN peers advertise to each other
            from syntrop.routerd.pressure import free_accelerator_bytes

            return ok({"status": "ok", "providers": len(self.providers),
                       "memory_some": self.pressure.memory_some(),
                       "free_accelerator_bytes": free_accelerator_bytes()})
        if path == "/metrics":
            from syntrop.routerd.metrics import render

            return Response(200, render(self).encode(),
                            "text/plain; version=0.0.4; charset=utf-8")
        if path == "/v1/models" or path.startswith("/v1/models/"):
            return await self._models(method, path)
        if path in RERANK_PATHS or path == "/v1/messages":
            return await self._translated(method, path, body, traffic, forwarded)
        endpoint = ENDPOINTS.get(path)
        if endpoint is None:
            return error(404, f"unknown endpoint {path}", "unknown_url")
        if method != "POST":
            return error(405, "use POST")
        self.requests_total += 1
        try:
            request = parse(body)
            check(endpoint, request)
        except BadRequest as bad:
            return error(400, str(bad), bad.code, bad.param)
        model = request.get("model") or self.default_model()
        if model is None:
            self.routing_errors += 1
            return error(404, "no model named and no default model", "model_not_found", "model")
        deadline = time.monotonic() + self.config.deadline
        if not self.admission.try_enter(traffic):
            try:
                async with asyncio.timeout(self.config.deadline):
                    await self.admission.enter(traffic)
            except TimeoutError:
                return error(503, "routerd is at its limit of requests in flight",
                             "server_overloaded")
        stream = None
        try:
            chain = self.chain(endpoint, request, model)
            candidates = await self._usable(endpoint, model, prompt_tokens(endpoint, request),
                                            deadline, chain, forwarded)
            if isinstance(candidates, Response):
                return candidates
            if not request.get("stream"):
                return await self._complete(endpoint, request, candidates, chain)
            opened = await self.open_stream(endpoint, request, candidates)
            if isinstance(opened, ProviderError):
                return self._failed(opened)
            current, first, chunks = opened
            self.affinity.routed(current.provider, current.model, chain)
            stream = Relay(self, endpoint, request, candidates, current, first, chunks,
                            traffic)
            return Response(200, content_type="text/event-stream", stream=stream.run(),
                            headers=served_by(current),
                            closer=stream.close)
        finally:
            if stream is None:
                self.admission.leave(traffic)
                self.changed()

    async def _translated(self, method: str, path: str, body: bytes, traffic: str,
                          forwarded: bool) -> Response:
        """Rerank and Anthropic's Messages: other APIs, translated onto
        embeddings and chat (routed as those are)."""
        if path in RERANK_PATHS:
            from syntrop.routerd.rerank import rerank

            return await rerank(method, body, lambda asked: self._handle(
                method, "/v1/embeddings", asked, traffic, forwarded))
        from syntrop.routerd.anthropic import messages

        return await messages(method, body, lambda chat: self._handle(
            method, "/v1/chat/completions", chat, traffic, forwarded))

    async def _models(self, method: str, path: str) -> Response:
        """GET /v1/models and /v1/models/{id}: every provider's, and the aliases."""
        if method != "GET":
            return error(405, "use GET")
        await self.rediscover()
        data = [{"id": m, "object": "model", "created": 0, "owned_by": p}
                for m, p in self.models()]
        data += [{"id": a, "object": "model", "created": 0, "owned_by": "routerd"}
                 for a in scoring.ALIASES]
        if path == "/v1/models":
            return ok({"object": "list", "data": data})
        from urllib.parse import unquote

        wanted = unquote(path.removeprefix("/v1/models/"))
        found = next((m for m in data if m["id"] == wanted), None)
        return ok(found) if found is not None else error(
            404, f"no provider lists the model {wanted!r}", "model_not_found", "model")

    def _failed(self, failure: ProviderError) -> Response:
        if not failure.retryable:
            return error(failure.status, failure.message, "upstream_rejected")
        self.routing_errors += 1
        code = "upstream_timeout" if failure.status == 504 else "upstream_error"
        return error(failure.status, failure.message, code)

    async def _complete(self, endpoint: str, request: dict[str, Any],
                        candidates: list[scoring.Scored],
                        chain: Sequence[tuple[str, int]] = ()) -> Response:
        last = ProviderError(502, "no provider answered")
        for candidate in candidates:
            breaker = self._breaker(candidate)
            if not breaker.acquire(time.monotonic()):
                continue
            started = time.monotonic()
            provider = self.providers[candidate.provider]
            try:
                answer = await provider.complete(endpoint, {**request, "model": candidate.model})
            except ProviderError as failure:
                self.ended(candidate.provider)
                if not failure.retryable:
                    breaker.release()
                    return self._failed(failure)
                logger.warning("provider %s failed: %s", candidate.provider, failure.message)
                self.failed(candidate)
                last = failure
                continue
            except BaseException:
                breaker.release()
                self.ended(candidate.provider)
                raise
            self.ended(candidate.provider)
            self.succeeded(candidate, (time.monotonic() - started) * 1000)
            self.affinity.routed(candidate.provider, candidate.model, chain)
            body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            return Response(200, body, headers=served_by(candidate))
        return self._failed(last)

    async def open_stream(self, endpoint: str, request: dict[str, Any],
                          candidates: list[scoring.Scored]) -> "Opened | ProviderError":
        """The first candidate that answers a first chunk: it, the chunk
        and the rest; or the last failure."""
        last = ProviderError(502, "no provider answered")
        for candidate in candidates:
            breaker = self._breaker(candidate)
            if not breaker.acquire(time.monotonic()):
                continue
            started = time.monotonic()
            provider = self.providers[candidate.provider]
            body = {**request, "model": candidate.model}
            if body.pop(CONTINUATION, False) and getattr(provider, "continues", False):
                body["continue_final_message"] = True
            chunks = provider.stream(endpoint, body)
            try:
                first: str | None = await chunks.__anext__()
            except StopAsyncIteration:
                first = None
            except ProviderError as failure:
                await chunks.aclose()  # type: ignore[attr-defined]
                if not failure.retryable:
                    breaker.release()
                    return failure
                logger.warning("provider %s failed: %s", candidate.provider, failure.message)
                self.failed(candidate)
                last = failure
                continue
            except BaseException:
                breaker.release()
                await chunks.aclose()  # type: ignore[attr-defined]
                raise
            self.succeeded(candidate, (time.monotonic() - started) * 1000)
            return candidate, first, chunks
        return last
