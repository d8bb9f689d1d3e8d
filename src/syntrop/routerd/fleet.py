"""A fleet of routerd nodes, its membership and load in etcd.

Each node keeps one key under the cluster prefix, bound to an etcd lease it
keeps alive:

    {prefix}nodes/{node}  ->  {"node", "endpoint", "models", "free_slots",
                               "memory_some", "free_accelerator_bytes",
                               "free_host_bytes", "caches", "published"}

where "caches" maps each model its runtimed serves to {"prefixes": the chat
prefix digests its idle contexts hold, "contexts": how many hold one,
"capacity": its slots} (affinity.py routes by it),

published again when its models or load change (`poke`: a request ended;
or seen at a renewal), at most every `publish_interval` seconds, and
renewed every ttl/3 seconds. A node that
dies stops renewing: etcd deletes its key when the lease's TTL runs out,
and every other node's watch sees it go.

Every request fails over across the configured endpoints (etcd.py), each
try bounded by ttl/3 divided among them. A request or watch that fails
anyway starts the session again at once on the next endpoint, keeping the
lease while it lives: losing one member, even the one every node talks to
first, changes nothing. Only when no endpoint has answered for ttl/3 since
the first failure is the node cut off from etcd (partitioned, or etcd has
lost quorum): the others drop it after the TTL, and it keeps the last
members it knew, says `degraded` (Router1.GetStatus, routerctl status), and
tries again every second; when etcd answers it takes a new lease,
publishes, and reads the members afresh.

Members become `peer` providers of the gateway (tier lan, their models as
they published them), so routing, breakers and the continuation of a stream
whose node dies mid-answer are the ones LAN peers already have. A member
that published no free slot, or more requests waiting than queue_bound, is
throttled like a full local runtimed: tried after the others (a prefix
whose home it is goes to its next home, scoring.homes).

Members become `peer` providers, and `caches` are what routing's affinity
knows of them.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from syntrop.routerd.config import FleetConfig, ProviderConfig
from syntrop.routerd.etcd import Etcd, EtcdError

logger = logging.getLogger(__name__)

#: Seconds between two tries while etcd does not answer (degraded).
RETRY = 1.0
#: Seconds before the next try after a failure, within ttl/3 of it.
RETRY_SOON = 0.05
#: A member's cache of one model: (provider, model, prefixes, contexts, capacity).
Cached = tuple[str, str, list[str], int, int]


class Fleet:
    def __init__(self, config: FleetConfig,
                 on_members: Callable[[tuple[ProviderConfig, ...], dict[str, float],
                                       tuple[Cached, ...], dict[str, int]], None],
                 load: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self.config = config
        # One sweep over every endpoint fits in ttl/3, the time etcd has to
        # answer before this node says degraded.
        self.etcd = Etcd(config.etcd, timeout=config.ttl / 3 / len(config.etcd),
                         tls_ca=config.etcd_ca, tls_cert=config.etcd_cert,
                         tls_key=config.etcd_key)
        self.on_members = on_members
        self.load = load
        self.key = f"{config.prefix}nodes/{config.node}"
        #: "starting", "ok" or "degraded" (etcd unreachable: last members kept).
        self.state = "starting"
        self.reason = ""
        #: node -> its record, as last known.
        self.members: dict[str, dict[str, Any]] = {}
        self.lease: int | None = None
        self._published: tuple[Any, ...] | None = None
        self._published_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._poked = asyncio.Event()

    def poke(self) -> None:
        """This node's load changed: publish it soon (rate-limited)."""
        self._poked.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Leave: the key goes with the revoked lease at once (others need
        not wait for the TTL)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.lease is not None:
            with contextlib.suppress(EtcdError):
                await asyncio.wait_for(self.etcd.revoke(self.lease), 1.0)
        self.etcd.close()

    # the loop ---------------------------------------------------------------

    async def _run(self) -> None:
        failing_since: float | None = None  # the first failure since etcd answered
        while True:
            try:
                await self._session()
            except EtcdError as error:
                reason = str(error)[:300]
            except Exception:  # never let the fleet take routerd down
                logger.exception("fleet: unexpected failure")
                reason = "internal error"
            now = time.monotonic()
            if failing_since is None or self.etcd.answered_at > failing_since:
                failing_since = now
            if now - failing_since < self.config.ttl / 3:
                logger.info("fleet: etcd failed, trying again: %s", reason)
                await asyncio.sleep(RETRY_SOON)
                continue
            if self.state != "degraded":
                logger.warning("fleet: etcd unreachable, keeping the %d members known: %s",
                               len(self.members), reason)
            self.state, self.reason, self.lease = "degraded", reason, None
            await asyncio.sleep(RETRY)

    async def _session(self) -> None:
        """One stretch with etcd answering: lease (the one held, while it
        lives), publish, read, watch and renew until something fails
        (EtcdError)."""
        if self.lease is not None and await self.etcd.keepalive(self.lease) == 0:
            self.lease = None
        if self.lease is None:
            self.lease = await self.etcd.grant(self.config.ttl)
        self._published = None
        await self._publish()
        revision, found = await self.etcd.range_prefix(f"{self.config.prefix}nodes/")
        known, self.members = self.members, {}
        for key, value in found.items():
            self._apply(key, value, known)
        for node in sorted(known.keys() - self.members.keys()):
            logger.info("fleet: %s left", node)
        self._changed()
        if self.state != "ok":
            logger.info("fleet: member %s of %d, etcd answering", self.config.node,
                        len(self.members) + 1)
        self.state, self.reason = "ok", ""
        loop = asyncio.get_running_loop()
        watch = loop.create_task(self._watch(revision + 1))
        renew_at = time.monotonic() + self.config.ttl / 3
        pending = False  # a publish is due once publish_interval allows it
        try:
            while True:
                due = renew_at
                if pending:
                    due = min(due, self._published_at + self.config.publish_interval)
                poked = loop.create_task(self._poked.wait())
                await asyncio.wait([watch, poked], timeout=max(0.0, due - time.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
                poked.cancel()
                if watch.done():
                    break
                if self._poked.is_set():
                    self._poked.clear()
                    pending = True
                now = time.monotonic()
                if now >= renew_at:
                    if await self.etcd.keepalive(self.lease) == 0:
                        raise EtcdError("the lease expired")
                    renew_at, pending = now + self.config.ttl / 3, True
                if pending and now - self._published_at >= self.config.publish_interval:
                    await self._publish()
                    pending = False
            watch.result()
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, EtcdError):
                await watch

    async def _watch(self, revision: int) -> None:
        async for event in self.etcd.watch(f"{self.config.prefix}nodes/", revision):
            if event.kind == "DELETE":
                node = event.key.rpartition("/")[2]
                if node == self.config.node:
                    raise EtcdError("our own key was deleted")
                if self.members.pop(node, None) is not None:
                    logger.info("fleet: %s left", node)
            else:
                self._apply(event.key, event.value)
            self._changed()

    # members ------------------------------------------------------------------

    def _apply(self, key: str, value: str,
               known: dict[str, dict[str, Any]] | None = None) -> None:
        """A member's record; `known`: the members before (else the current
        ones), to tell who joined."""
        node = key.rpartition("/")[2]
        if node == self.config.node:
            return
        try:
            record = json.loads(value)
            endpoint = record["endpoint"]
            models = [str(m) for m in record.get("models", [])]
        except (ValueError, KeyError, TypeError):
            logger.warning("fleet: %s published a malformed record, ignored", node)
            return
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            return
        if node not in (self.members if known is None else known):
            logger.info("fleet: %s joined at %s", node, endpoint)
        self.members[node] = {**record, "models": models}

    def providers(self) -> tuple[ProviderConfig, ...]:
        """The members as peer providers."""
        config = self.config
        return tuple(
            ProviderConfig(id=f"fleet:{node}", kind="peer", tier="lan",
                           endpoint=record["endpoint"], models=tuple(record["models"]),
                           tls_ca=config.peer_ca, tls_cert=config.peer_cert,
                           tls_key=config.peer_key, timeout=60.0)
            for node, record in sorted(self.members.items()))

    def _changed(self) -> None:
        self.on_members(self.providers(), self.full(), self.caches(), self.free())

    def caches(self) -> tuple[Cached, ...]:
        """What the members' runtimed hold, as they published it (entries
        that are not well formed are left out)."""
        found: list[Cached] = []
        for node, record in sorted(self.members.items()):
            caches = record.get("caches")
            for model, cache in (caches.items() if isinstance(caches, dict) else ()):
                try:
                    found.append((f"fleet:{node}", str(model),
                                  [str(d) for d in cache["prefixes"]][:256],
                                  int(cache["contexts"]), int(cache["capacity"])))
                except (KeyError, TypeError, ValueError):
                    continue
        return tuple(found)

    def full(self) -> dict[str, float]:
        """Members that published no free slot (their runtimed is full) or
        more requests waiting than queue_bound, and when they published it
        (epoch seconds)."""
        return {f"fleet:{node}": float(record.get("published") or 0.0)
                for node, record in self.members.items()
                if record.get("free_slots") == 0 or self._over_queue(record)}

    def _over_queue(self, record: dict[str, Any]) -> bool:
        queued = record.get("queue_depth")
        return isinstance(queued, int) and queued > self.config.queue_bound

    def free(self) -> dict[str, int]:
        """The members' free runtimed slots, as they last published them
        (those that published none left out)."""
        return {f"fleet:{node}": record["free_slots"] for node, record in self.members.items()
                if isinstance(record.get("free_slots"), int)}

    # publishing ---------------------------------------------------------------

    async def _publish(self) -> None:
        """This node's record, when it changed (renewal alone keeps it
        alive); the caller keeps to publish_interval."""
        load = await self.load()
        record = {"node": self.config.node, "endpoint": self.config.advertise, **load}
        signature = tuple(sorted((k, json.dumps(v)) for k, v in record.items()))
        now = time.monotonic()
        if signature == self._published:
            return
        await self.etcd.put(self.key, json.dumps({**record, "published": time.time()}),
                            self.lease)
        self._published, self._published_at = signature, now

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "node": self.config.node, "members": sorted(self.members),
                "reason": self.reason}
