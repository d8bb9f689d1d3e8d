"""When local work goes elsewhere: memory pressure over the threshold, or a
local runtimed (a fleet member) without a free slot; runtimed's load and
LAN peers' advertisements, looked at in the background."""

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from syntrop.routerd import scoring
from syntrop.routerd.config import ProviderConfig
from syntrop.routerd.pressure import Pressure
from syntrop.routerd.providers import Provider, ProviderError
from syntrop.routerd.registry import DISCOVERY_TIMEOUT, Registry

if TYPE_CHECKING:
    from syntrop.interfaces.runtime import LoadResult

logger = logging.getLogger(__name__)

#: Seconds between two looks at runtimed's free slots.
LOAD_INTERVAL = 1.0
#: Seconds between two asks for a LAN peer's advertisement.
ADVERTISE_INTERVAL = 5.0


class Offload:
    """The load of this node's runtimed and of the LAN peers, as last seen;
    routing reads it and never waits for it."""

    def __init__(self, registry: Registry, pressure: Pressure) -> None:
        self.registry = registry
        self.pressure = pressure
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

    def throttled(self) -> bool:
        """Local work is throttled: memory pressure over the threshold, or a
        local runtimed without a free slot."""
        self._look_at_load()
        self._look_at_peers()
        return self.pressure.high() or bool(self.busy(self.full))

    def busy(self, full: dict[str, float]) -> frozenset[str]:
        """Of providers seen without a free slot, those seen so after our
        last request to them ended (else the slot was likely its own)."""
        return frozenset(p for p, at in full.items()
                         if at > self.ended_at.get(p, float("-inf")))

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
        for peer in self.registry.providers.values():
            if peer.capabilities.advertise:
                peer.advertised_at = float("-inf")
        self._look_at_peers()

    def _look_at_peers(self) -> None:
        now = time.monotonic()
        stale = [p for p in self.registry.providers.values()
                 if p.capabilities.advertise and now - p.advertised_at >= ADVERTISE_INTERVAL]
        for peer in stale:
            peer.advertised_at = now
        if stale:
            self._spawn(self.advertise(stale))

    async def advertise(self, peers: list[Provider] | None = None) -> None:
        """Ask LAN peers for their health, RTT and free accelerator memory;
        a peer that fails opens the breakers of its models."""
        registry = self.registry
        if peers is None:
            peers = [p for p in registry.providers.values() if p.capabilities.advertise]
        for peer in peers:
            try:
                await asyncio.wait_for(peer.advertise(), DISCOVERY_TIMEOUT)
                if not peer.config.models and peer.config.id not in registry.discovered:
                    # Unreachable at start or Reload, back now: its models.
                    models = await asyncio.wait_for(peer.list_models(), DISCOVERY_TIMEOUT)
                    registry.discovered = {**registry.discovered,
                                           peer.config.id: tuple(models)}
            except (ProviderError, TimeoutError) as failure:
                logger.warning("peer %s: %s", peer.config.id, failure or "no answer in time")
                now = time.monotonic()
                if peer.config.id in registry.health:
                    registry.health[peer.config.id].failure(now)
                for config in registry.effective():
                    if config.id == peer.config.id:
                        for model in config.models:
                            registry.breakers.setdefault((config.id, model),
                                                         scoring.Breaker()).failure(now)

    async def refresh_load(self) -> None:
        """Ask every local runtimed for its load now."""
        self._load_at = time.monotonic()
        await self._refresh_load([p for p in self.registry.config.providers
                                  if p.kind == "runtimed"])

    def _look_at_load(self) -> None:
        """Refresh runtimed's free slots in the background, once a second at
        most; routing uses the last answer and never waits for it."""
        now = time.monotonic()
        if now - self._load_at < LOAD_INTERVAL:
            return
        locals_ = [p for p in self.registry.config.providers if p.kind == "runtimed"]
        if not locals_:
            return
        self._load_at = now
        self._spawn(self._refresh_load(locals_))

    async def _refresh_load(self, locals_: list[ProviderConfig]) -> None:
        for config in locals_:
            provider = self.registry.providers.get(config.id)
            asked = time.time()
            load = await provider.load() if provider is not None and \
                provider.capabilities.load else None
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
        fleet = self.registry.config.fleet
        return bool(fleet.etcd) and queued > fleet.queue_bound

    def _report_caches(self, provider: str, load: "LoadResult") -> None:
        """What a runtimed's load says its KV caches hold, per model it
        serves: a model not loaded, or without a chat yet, holds nothing
        and has every slot's room."""
        loaded = {m.name: m for m in load.get("models") or ()}
        served = next((p.models for p in self.registry.effective() if p.id == provider), ())
        for name in {*served, *loaded}:
            model = loaded.get(name)
            self.registry.affinity.report(
                provider, name, (model.prefixes or []) if model else [],
                (model.cached_contexts or 0) if model else 0, int(load["total_slots"]))
