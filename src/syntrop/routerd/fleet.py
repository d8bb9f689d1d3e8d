"""A fleet of routerd nodes, its membership and load in etcd.

Each node keeps one key under the cluster prefix, bound to an etcd lease it
keeps alive:

    {prefix}nodes/{node}  ->  {"node", "endpoint", "models", "free_slots",
                               "memory_some", "free_accelerator_bytes",
                               "published"}

published again when its models or load change (at most every
`publish_interval` seconds), and renewed every ttl/3 seconds. A node that
dies stops renewing: etcd deletes its key when the lease's TTL runs out,
and every other node's watch sees it go. A node cut off from etcd
(partitioned, or etcd has lost quorum) cannot renew either: the others drop
it after the TTL, and it keeps the last members it knew, says `degraded`
(Router1.GetStatus, routerctl status), and tries again every second; when
etcd answers it takes a new lease, publishes, and reads the members afresh.

Members become `peer` providers of the gateway (tier lan, their models as
they published them), so routing, breakers and the continuation of a stream
whose node dies mid-answer are the ones LAN peers already have. A member
that published no free slot is throttled like a full local runtimed: tried
after the others.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from syntrop.routerd.config import FleetConfig, ProviderConfig
from syntrop.routerd.etcd import Etcd, EtcdError

logger = logging.getLogger(__name__)

#: Seconds between two tries while etcd does not answer.
RETRY = 1.0


class Fleet:
    def __init__(self, config: FleetConfig,
                 on_members: Callable[[tuple[ProviderConfig, ...], frozenset[str]], None],
                 load: Callable[[], dict[str, Any]]) -> None:
        self.config = config
        self.etcd = Etcd(config.etcd, timeout=max(1.0, config.ttl / 3), tls_ca=config.etcd_ca,
                         tls_cert=config.etcd_cert, tls_key=config.etcd_key)
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

    # the loop ---------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._session()
            except EtcdError as error:
                if self.state != "degraded":
                    logger.warning("fleet: etcd unreachable, keeping the %d members known: %s",
                                   len(self.members), error)
                self.state, self.reason = "degraded", str(error)[:300]
            except Exception:  # never let the fleet take routerd down
                logger.exception("fleet: unexpected failure")
                self.state, self.reason = "degraded", "internal error"
            self.lease = None
            await asyncio.sleep(RETRY)

    async def _session(self) -> None:
        """One stretch with etcd answering: lease, publish, read, watch and
        renew until something fails (EtcdError)."""
        self.lease = await self.etcd.grant(self.config.ttl)
        self._published = None
        await self._publish()
        revision, found = await self.etcd.range_prefix(f"{self.config.prefix}nodes/")
        self.members = {}
        for key, value in found.items():
            self._apply(key, value)
        self._changed()
        if self.state != "ok":
            logger.info("fleet: member %s of %d, etcd answering", self.config.node,
                        len(self.members) + 1)
        self.state, self.reason = "ok", ""
        watch = asyncio.get_running_loop().create_task(self._watch(revision + 1))
        try:
            while not watch.done():
                await asyncio.wait([watch], timeout=self.config.ttl / 3)
                if watch.done():
                    break
                if await self.etcd.keepalive(self.lease) == 0:
                    raise EtcdError("the lease expired")
                await self._publish()
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

    def _apply(self, key: str, value: str) -> None:
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
        if node not in self.members:
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
        self.on_members(self.providers(), self.full())

    def full(self) -> frozenset[str]:
        """Members that published no free slot (their runtimed is full)."""
        return frozenset(f"fleet:{node}" for node, record in self.members.items()
                         if record.get("free_slots") == 0)

    def free_slots(self, provider_id: str) -> int | None:
        """What member `provider_id` (fleet:NODE) last published of its free
        runtimed slots; None when unknown."""
        record = self.members.get(provider_id.removeprefix("fleet:"))
        free = record.get("free_slots") if record else None
        return free if isinstance(free, int) else None

    # publishing ---------------------------------------------------------------

    async def _publish(self) -> None:
        """This node's record, when it changed and publish_interval has
        passed (renewal alone keeps it alive)."""
        load = self.load()
        record = {"node": self.config.node, "endpoint": self.config.advertise, **load}
        signature = tuple(sorted((k, json.dumps(v)) for k, v in record.items()))
        now = time.monotonic()
        recent = now - self._published_at < self.config.publish_interval
        if signature == self._published or (recent and self._published is not None):
            return
        await self.etcd.put(self.key, json.dumps({**record, "published": time.time()}),
                            self.lease)
        self._published, self._published_at = signature, now

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "node": self.config.node, "members": sorted(self.members),
                "reason": self.reason}
