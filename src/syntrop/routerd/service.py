"""The Varlink face of routerd (io.syntrop.Router1) and the owner of its
HTTP ingress: `RouterService.open` loads routerd.toml and starts the
listeners; `keep_alive` keeps the daemon up while it serves HTTP."""

import asyncio
import logging
import socket
import time
from typing import TYPE_CHECKING

from syntrop.config import ConfigError, Paths
from syntrop.interfaces.router import (
    Candidate,
    ConfigInvalid,
    ModelsResult,
    NoRoute,
    NotAuthorized,
    Provider,
    ProviderNotFound,
    RouteMessage,
    Router1,
    StatusResult,
    TestResult,
)
from syntrop.routerd import config as routerconfig
from syntrop.routerd import scoring
from syntrop.routerd.gateway import Gateway
from syntrop.routerd.http import HTTPServer
from syntrop.routerd.providers import ProviderError
from syntrop.routerd.registry import DISCOVERY_TIMEOUT
from syntrop.system import process
from syntrop.varlink import authz, implements

if TYPE_CHECKING:
    from syntrop.routerd.fleet import Fleet

#: Seconds a real probe of a provider may take (runtimed: a model load and a token).
PROBE_TIMEOUT = 60.0

logger = logging.getLogger(__name__)


def check_fleet(config: routerconfig.Config) -> None:
    """A fleet's members reach each other over mutual TLS, the only way a
    node takes what another forwards (http.py): a node advertises its
    tls_listen as https:// and has a client certificate (fleet.peer_cert).
    Over plain HTTP a member would be a client: its forwarded requests
    routed again, its prefill pulls answered 404. ConfigError otherwise."""
    fleet = config.fleet
    if fleet.etcd and not (config.tls_listen and fleet.advertise.startswith("https://")
                           and fleet.peer_cert):
        raise ConfigError("a fleet's members reach each other over mutual TLS: set "
                          "http.tls_listen (with tls_cert, tls_key, tls_client_ca), "
                          "fleet.advertise to its https:// URL, and fleet.peer_cert and "
                          "peer_key")


class RouterService(Router1):
    """Routes OpenAI-style requests between providers."""

    def __init__(self, paths: Paths, config: routerconfig.Config | None = None) -> None:
        self.paths = paths
        self.path = paths.configuration / "routerd.toml"
        self.config = config or routerconfig.Config(listen=())
        self.gateway = Gateway(self.config, paths)
        self.http = HTTPServer(self.gateway, self.config)
        self.started = time.monotonic()
        self.fleet: Fleet | None = None

    @classmethod
    async def open(cls, paths: Paths,
                   sockets: "list[socket.socket] | None" = None) -> "RouterService":
        """Load the configuration and start the HTTP listeners: those passed
        by routerd.socket, or (without any: development) `http.listen`
        bound here. A broken file is an error at start (systemd shows it);
        at Reload it is not."""
        service = cls(paths, routerconfig.load(paths.configuration / "routerd.toml"))
        check_fleet(service.config)
        if sockets:
            await service.http.adopt(sockets)
        else:
            await service.http.start(service.config.listen)
        if service.config.tls_listen:
            from syntrop.routerd.tls import server_context

            config = service.config
            context = server_context(config.tls_cert, config.tls_key, config.tls_client_ca)
            await service.http.start(config.tls_listen, tls=context)
        # In the background: the first reply (a /health, a Varlink call) must
        # not wait for providers' model lists; a request that needs one
        # waits for this same round (Registry.rediscover).
        service.gateway.registry.start_discovery()
        # In the background too: a dead peer must not delay start.
        service.gateway.offload.look_at_peers()
        if service.config.fleet.etcd:
            from syntrop.routerd.fleet import Fleet

            service.fleet = Fleet(service.config.fleet, service.gateway.registry.set_fleet,
                                  service.fleet_load)
            service.fleet.start()
            service.gateway.changed = service.fleet.poke
        logger.info("HTTP on %s", ", ".join(service.http.addresses) or "nothing")
        return service

    def keep_alive(self) -> bool:
        """Stay while HTTP clients are connected or came since the last idle
        check (Varlink idleness alone must not end the HTTP ingress), and
        always in a fleet: leaving on idle would drop this node from it."""
        active, self.http.active = self.http.active, False
        return self.http.connections > 0 or active or self.fleet is not None

    async def aclose(self) -> None:
        if self.fleet is not None:
            await self.fleet.close()
        await self.http.close()
        self.gateway.close()

    async def fleet_load(self) -> dict[str, object]:
        """What this node publishes to the fleet: its own models and load,
        runtimed's as it answers now."""
        from syntrop.routerd.pressure import free_accelerator_bytes, free_host_bytes

        offload, registry = self.gateway.offload, self.gateway.registry
        await offload.refresh_load()
        slots = [f for f in offload.free_slots.values() if f is not None]
        locals_ = {p.id for p in self.config.providers if p.kind == "runtimed"}
        caches = {model: {"prefixes": sorted(cache.prefixes), "contexts": cache.contexts,
                          "capacity": cache.capacity}
                  for (provider, model), cache in sorted(registry.affinity.caches.items())
                  if provider in locals_}
        return {"models": registry.local_models(),
                "caches": caches,
                "free_slots": sum(slots) if slots else None,
                "queue_depth": sum(offload.queued.values()),
                "memory_some": round(offload.pressure.memory_some(), 1),
                "free_accelerator_bytes": free_accelerator_bytes(),
                # In 64 MiB steps: the record is written again only when
                # something in it changes.
                "free_host_bytes": (free_host_bytes() or 0) >> 26 << 26 or None}

    @implements
    def GetStatus(self) -> StatusResult:
        health = self.gateway.registry.health
        healthy = sum(1 for h in health.values() if h.status() != "cooling")
        return StatusResult(
            uptime_usec=int((time.monotonic() - self.started) * 1_000_000),
            ingress=list(self.http.addresses),
            rss_bytes=process.rss_bytes(),
            memory_some=self.gateway.offload.pressure.memory_some(),
            providers_total=len(self.config.providers),
            providers_healthy=healthy,
            requests_total=self.gateway.requests_total,
            routing_errors=self.gateway.router.routing_errors,
            ingress_failed=list(self.http.failed),
            fleet=self.fleet.state if self.fleet is not None else "off",
            fleet_members=sorted(self.fleet.members) if self.fleet is not None else [],
        )

    @implements
    def ListProviders(self) -> list[Provider]:
        result = []
        for provider in self.gateway.registry.effective():
            health = self.gateway.registry.health[provider.id]
            latency = None if health.latency_ms is None else round(health.latency_ms, 2)
            live = self.gateway.registry.providers.get(provider.id)
            result.append(Provider(
                id=provider.id, kind=provider.kind, tier=provider.tier, status=health.status(),
                weight=provider.weight, latency_ms=latency, models=list(provider.models),
                rtt_ms=live.rtt_ms if live is not None else None,
                free_accelerator_bytes=live.free_accelerator_bytes if live is not None else None))
        return result

    @implements
    def ListModels(self) -> ModelsResult:
        return ModelsResult(models=[m for m, _ in self.gateway.registry.models()],
                            aliases=list(scoring.ALIASES),
                            default_model=self.gateway.registry.default_model())

    @implements
    def Route(self, *, model: str, prompt_tokens: int | None = None,
              messages: list[RouteMessage] | None = None) -> list[Candidate]:
        from syntrop.routerd.request import turns

        chain = self.gateway.router.chain(turns({"messages": [
            {"role": m.role, "content": m.content} for m in messages or ()]}), model)
        scored = self.gateway.router.route(model, prompt_tokens, chain=chain)
        if not scored:
            known = model in scoring.ALIASES or \
                any(m == model for m, _ in self.gateway.registry.models())
            raise NoRoute(model=model, reason="no provider fits the prompt" if known
                          else "no provider serves this model")
        return [Candidate(provider=s.provider, model=s.model, score=s.score, speed=s.speed,
                          cost=s.cost, capability=s.capability, selected=index == 0,
                          cooling=s.cooling, throttled=s.throttled,
                          prefix_chars=s.prefix_chars if chain else None,
                          cache_full=s.cache_full)
                for index, s in enumerate(scored)]

    @implements
    async def TestProvider(self, *, provider: str) -> TestResult:
        # A real probe: it may load a model in runtimed, or cost money upstream.
        await authz.authorize(authz.MANAGE_ROUTER, NotAuthorized)
        target = self.gateway.registry.providers.get(provider)
        if target is None:
            raise ProviderNotFound(provider=provider)
        started = time.monotonic()
        try:
            if target.capabilities.probe:
                # A provider that can run a real request does (runtimed: its
                # engine's state and a one-token completion, a model load
                # included); the others are asked for their models.
                detail = await asyncio.wait_for(target.probe(), PROBE_TIMEOUT)
            else:
                models = await asyncio.wait_for(target.list_models(), DISCOVERY_TIMEOUT)
                detail = f"answered with {len(models)} model(s)"
        except (ProviderError, TimeoutError) as failure:
            return TestResult(ok=False, latency_ms=round((time.monotonic() - started) * 1000, 2),
                              detail=str(failure) or "no answer in time")
        latency = (time.monotonic() - started) * 1000
        return TestResult(ok=True, latency_ms=round(latency, 2), detail=detail)

    @implements
    async def Reload(self) -> None:
        await authz.authorize(authz.MANAGE_ROUTER, NotAuthorized)
        try:
            config = routerconfig.load(self.path)
        except ConfigError as error:
            raise ConfigInvalid(path=str(self.path), reason=str(error)) from None
        # Listeners stay as they are; requests in flight keep their provider
        # objects, new ones get the new set.
        self.config = config
        self.http.config = config
        self.gateway.apply(config)
        await self.gateway.registry.discover()
        self.gateway.offload.look_at_peers()
