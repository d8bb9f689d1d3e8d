"""The fleet's prefill hand-off: a long chat whose node is busy decoding
is prefilled on an idle member, and its node answers from that KV state.

On a CPU node a prompt's prefill takes the cores the streams already
running there decode with: a 2,000-token prompt is seconds of them. When
the node routing picked for a chat (its home, or where its start is
resident) has streams running, more than `handoff_tokens` of the prompt
are not resident there, and another member is idle, then:

1. the entry node plans it (`plan`): the target stays first, the idle
   member is the helper; a target that is a member gets the helper's node
   id in the forwarded body (HANDOFF; within routerd it travels beside the
   request, as Handed, never in it);
2. the target's routerd pulls the state (`pull`): the helper's runtimed
   prefills the prompt but its last token, 1024 tokens a step
   (Runtime1.Prefill), through the helper's POST /v1/syntrop/prefill
   (`serve`) or directly when the helper is its own runtimed (a memfd); a
   member's bytes go, as they come, into a pipe whose read end is Chat's
   prefix_state: routerd (MemoryMax=32M) never holds a state, runtimed
   reads it into a memfd of its own; at most MAX_PULLS at once; the
   descriptor rides beside the request (Handed: runtimed's provider takes
   it once, the gateway closes it if none did);
3. the target's runtimed answers with that state restored (Chat's
   prefix_state), computing only the prompt's last token, the same greedy
   tokens as prefilling itself (tests/service/test_runtimed_handoff.py).

The state moves once, helper to target, whole: llama.cpp hands out a
sequence's state, not a part of one, so the steps are the helper's, not
the wire's. A failed pull costs the hand-off, never the answer: the target
prefills itself. Only members are pulled from (a node id that is not one
is refused), and runtimed takes a state only from root or its own user.
"""

import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from syntrop.routerd import scoring
from syntrop.routerd.api import BadRequest, Response, error
from syntrop.routerd.providers import ProviderError
from syntrop.routerd.providers.peer import PeerProvider
from syntrop.routerd.registry import Registry
from syntrop.routerd.request import Request, read

logger = logging.getLogger(__name__)

#: Where a member serves prefills for the others.
PREFILL_PATH = "/v1/syntrop/prefill"
#: Characters of a prompt per token, as routing estimates them.
CHARS_PER_TOKEN = 4
#: Bytes of a state read per step when it is sent.
SEND_CHUNK = 1 << 20
#: Pulls one routerd runs at once; a chat beyond them prefills itself.
MAX_PULLS = 2


class Handoff:
    """Plans hand-offs for requests this node routes, pulls states for the
    ones it answers, and serves its own runtimed's prefills."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        #: Outcomes, for /metrics: planned, pulled, failed, busy, served.
        self.counts: dict[str, int] = {}
        #: Pulls under way: from their start until their state is copied.
        self.pulling = 0

    def _count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    # the entry node -----------------------------------------------------------

    async def plan(self, candidates: list[scoring.Scored],
                   prompt_tokens: int) -> tuple[scoring.Scored, scoring.Scored] | None:
        """(the target, the helper) when the request is worth handing off
        (see the module); None to route it as it is. A member's slots are
        what it last published; this node's runtimed is asked now (a
        millisecond, against the seconds a prefill this long takes)."""
        threshold = self.registry.config.fleet.handoff_tokens
        if not threshold or not self.registry.fleet or not candidates:
            return None
        target = candidates[0]
        if target.cooling or target.throttled or \
                prompt_tokens - target.prefix_chars // CHARS_PER_TOKEN < threshold:
            return None
        free, total = await self._slots(target.provider, target.model)
        if free is None or total is None or not 0 < free < total:
            return None  # unknown, idle (it prefills fastest itself) or full (overflow)
        for other in candidates[1:]:
            if other.cooling or other.throttled or not self._prefills(other.provider):
                continue
            free, total = await self._slots(other.provider, other.model)
            if free is not None and free == total:
                self._count("planned")
                return target, other
        return None

    async def _slots(self, provider: str, model: str) -> tuple[int | None, int | None]:
        """A syntrop node's free slots and its slots; None where unknown."""
        cache = self.registry.affinity.caches.get((provider, model))
        total = cache.capacity if cache is not None else None
        if provider in self.registry.fleet_free:
            return self.registry.fleet_free[provider], total
        found = self.registry.providers.get(provider)
        load = await found.load() if found is not None and found.capabilities.load else None
        return (None, total) if load is None else (load["free_slots"], load["total_slots"])

    def _members(self) -> set[str]:
        return {p.id for p in self.registry.fleet}

    def _prefills(self, provider: str) -> bool:
        found = self.registry.providers.get(provider)
        return found is not None and found.capabilities.prefill

    # the target ---------------------------------------------------------------

    def helper(self, value: Any) -> str | None:
        """The provider a forwarded request's HANDOFF names: a fleet member
        or this node's own runtimed; None (logged: the target prefills)
        for anything else, a member this node has not seen join, say."""
        node = value.get("from") if isinstance(value, dict) else None
        found = next((p.id for p in self.registry.effective()
                      if isinstance(node, str) and self.registry.node_of(p.id) == node
                      and self._prefills(p.id) and (p.id in self._members()
                                                    or p.kind == "runtimed")), None)
        if found is None:
            logger.warning("prefill hand-off from %r: not a member here; prefilling here",
                           node)
            self._count("unknown")
        return found

    async def pull(self, provider: str, request: Request) -> int | None:
        """The state of `request`'s prompt from `provider` (a descriptor,
        the caller's: a memfd, or a pipe a member's state is copied into as
        it comes), or None when it could not be had, or when MAX_PULLS are
        under way already (the caller prefills)."""
        if self.pulling >= MAX_PULLS:
            logger.info("prefill hand-off from %s: %d pulls under way, prefilling here",
                        provider, self.pulling)
            self._count("busy")
            return None
        started = time.monotonic()
        self.pulling += 1
        try:
            found = self.registry.providers[provider]
            fd = await found.prefill(request)
        except (ProviderError, KeyError, OSError) as failure:
            self.pulling -= 1
            logger.warning("prefill hand-off from %s failed, prefilling here: %s", provider,
                           getattr(failure, "message", failure))
            self._count("failed")
            return None
        except BaseException:
            self.pulling -= 1
            raise
        copy = found.copies.get(fd) if isinstance(found, PeerProvider) else None
        if copy is None:
            self._pulled(provider, started, os.fstat(fd).st_size)
        else:  # a pull lasts until its copy ends
            copy.add_done_callback(lambda done: self._pulled(provider, started, None))
        self._count("pulled")
        return fd

    def _pulled(self, provider: str, started: float, size: int | None) -> None:
        self.pulling -= 1
        logger.info("prefill hand-off: %s of state from %s in %.2f s",
                    "streamed" if size is None else f"{size} bytes", provider,
                    time.monotonic() - started)

    # the helper ---------------------------------------------------------------

    async def serve(self, method: str, body: bytes) -> Response:
        """POST /v1/syntrop/prefill: a chat request's prompt prefilled by
        this node's runtimed, its state streamed back (octet-stream)."""
        if method != "POST":
            return error(405, "use POST")
        if not self.registry.fleet:
            return error(404, "prefill hand-off serves fleet members only", "unknown_url")
        try:
            request = read("chat/completions", body)
        except BadRequest as bad:
            return error(400, str(bad), bad.code, bad.param)
        model = request.model
        local = next((p for p in self.registry.effective() if p.kind == "runtimed"
                      and model in p.models and p.id not in self._members()), None)
        if local is None:
            return error(404, f"this node's runtimed does not serve {model!r}",
                         "model_not_found", "model")
        try:
            fd = await self.registry.providers[local.id].prefill(request)
        except ProviderError as failure:
            return error(failure.status, failure.message)
        self._count("served")

        async def chunks() -> AsyncIterator[bytes]:
            offset = 0
            while part := os.pread(fd, SEND_CHUNK, offset):
                offset += len(part)
                yield part

        async def close() -> None:
            os.close(fd)

        size = os.fstat(fd).st_size
        return Response(200, content_type="application/octet-stream", stream=chunks(),
                        closer=close, headers=((b"x-syntrop-state-bytes", b"%d" % size),))
