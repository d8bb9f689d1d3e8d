"""The providers routerd routes to: those configured and the fleet's other
nodes, with their health, breakers and prefix caches (affinity.py), and
the models each serves, configured or discovered."""

import asyncio
import contextlib
import logging
import time

from syntrop.config import Paths
from syntrop.routerd import scoring
from syntrop.routerd.affinity import Affinity
from syntrop.routerd.config import Config, ProviderConfig
from syntrop.routerd.providers import REGISTRY, Provider, ProviderError

logger = logging.getLogger(__name__)

#: Seconds a provider's model list may take at start and Reload.
DISCOVERY_TIMEOUT = 5.0
#: Least seconds between two asks for the model lists of providers that
#: have no configured list (a model pulled since is served without Reload).
REDISCOVER_INTERVAL = 2.0
#: Seconds the start-up round of discovery waits, unless a request needs
#: it sooner: the first reply of a cold start (a Varlink call, /health)
#: goes out before the provider clients are imported and asked.
START_DISCOVERY_DELAY = 0.2


class Registry:
    """Who serves what: the provider objects, their health and breakers,
    the fleet's members as peer providers, and the model lists."""

    def __init__(self, config: Config, paths: Paths) -> None:
        self.paths = paths
        self.health: dict[str, scoring.Health] = {}
        self.breakers: dict[tuple[str, str], scoring.Breaker] = {}
        self.discovered: dict[str, tuple[str, ...]] = {}
        self._discovered_at = float("-inf")
        self._discovering: asyncio.Task[None] | None = None
        self._needed: asyncio.Event | None = None  # set: a request waits for the round
        self._effective: tuple[object, object, tuple[ProviderConfig, ...]] = (None, None, ())
        #: The other nodes of the fleet, as peer providers (fleet.py sets them).
        self.fleet: tuple[ProviderConfig, ...] = ()
        self._fleet_seen: object = None
        #: Fleet members that published no free slot, and when.
        self.fleet_full: dict[str, float] = {}
        #: Fleet members' free runtimed slots, as they published them.
        self.fleet_free: dict[str, int] = {}
        #: Which provider holds which chat prefix (affinity.py).
        self.affinity = Affinity()
        self.apply(config)

    def apply(self, config: Config) -> None:
        """Switch to `config`'s providers; requests in flight keep theirs."""
        self.config = config
        self.providers: dict[str, Provider] = {
            p.id: REGISTRY[p.kind](p, self.paths) for p in config.providers}
        self.health = {p.id: self.health.get(p.id) or scoring.Health()
                       for p in config.providers}
        fleet, self.fleet = self.fleet, ()
        self.set_fleet(fleet)

    def set_fleet(self, members: tuple[ProviderConfig, ...],
                  full: dict[str, float] | None = None,
                  caches: tuple[tuple[str, str, list[str], int, int], ...] = (),
                  free: dict[str, int] | None = None) -> None:
        """The fleet's other nodes now (from etcd): new ones become peer
        providers, gone ones are dropped, unchanged ones keep their
        connections, health and breakers. `full`: those that published no
        free slot, throttled like a full local runtimed. `caches`: what
        their runtimed holds, as (provider, model, prefixes, contexts,
        capacity). `free`: the free slots each published."""
        self.fleet_full = full or {}
        self.fleet_free = free or {}
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

    def node_of(self, provider: str) -> str:
        """The fleet node `provider` runs on: a member's node id, this node's
        for its own (local) providers; other providers are their own."""
        if provider.startswith("fleet:") and any(p.id == provider for p in self.fleet):
            return provider.removeprefix("fleet:")
        local = any(p.id == provider and p.tier == "local" for p in self.config.providers)
        return self.config.fleet.node if local and self.config.fleet.node else provider
