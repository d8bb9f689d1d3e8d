"""What every provider is: the Provider protocol, the Capabilities it
declares, ProviderError, and Handed, a prefill hand-off passed beside a
request (the provider modules import this, not the package, which imports
them)."""

import os
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from syntrop.routerd.config import ProviderConfig

if TYPE_CHECKING:
    from syntrop.interfaces.runtime import LoadResult
    from syntrop.routerd.request import Request


#: Most bytes of such a state a node takes from another (a 131,072-token
#: context of SmolLM2 is about 3 GiB).
MAX_STATE_BYTES = 4 << 30


class Handed:
    """A chat's prefill hand-off (handoff.py), passed to providers beside
    its request: a KV state that runtimed answers from (Chat's
    prefix_state), or the helper named for the fleet member it was planned
    for. The state's descriptor is owned here until `take` hands it over,
    once; `close` closes it if none took it."""

    def __init__(self, fd: int | None = None, helper: str | None = None,
                 member: str | None = None) -> None:
        self._fd = fd
        #: The helper's node id, for `member` (a provider id) only.
        self.helper, self.member = helper, member

    def take(self) -> int | None:
        """The state's descriptor, now the caller's to close; None once
        taken, or when there is none."""
        fd, self._fd = self._fd, None
        return fd

    def close(self) -> None:
        if (fd := self.take()) is not None:
            os.close(fd)

    def helper_for(self, provider: str) -> str | None:
        """The helper's node id when `provider` is the member it was
        planned for (not sent on further)."""
        return self.helper if provider == self.member else None


class ProviderError(Exception):
    """A provider could not answer. `status` is the HTTP status routerd
    answers with when no other candidate can: 502 garbage or unreachable,
    504 too slow, or the upstream's own 4xx (not retried: the request is at
    fault, not the provider)."""

    def __init__(self, status: int, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a provider can do besides complete, stream and list_models:
    the gateway asks only for what these name."""

    #: Reports its load (`load`: free slots, queue, caches), as runtimed.
    load: bool = False
    #: Runs a real check (`probe`, Router1.TestProvider); the others are
    #: asked for their models instead.
    probe: bool = False
    #: Advertises its health, RTT and free accelerator memory
    #: (`advertise`), as a LAN peer.
    advertise: bool = False
    #: Continues an answer begun (continue_final_message).
    continues: bool = False
    #: Takes part in the prefill hand-off (handoff.py): `prefill` hands out
    #: a chat prompt's KV state in a memfd; runtimed also answers from one
    #: (Handed.take), a fleet member pulls one itself (Handed.helper_for).
    prefill: bool = False


class Provider(Protocol):
    config: ProviderConfig
    capabilities: Capabilities
    #: When it last advertised (monotonic seconds), what that took, and the
    #: free accelerator memory it named; None, -inf: not known.
    advertised_at: float
    rtt_ms: float | None
    free_accelerator_bytes: int | None

    async def complete(self, request: "Request",
                       handed: Handed | None = None) -> dict[str, Any] | bytes: ...

    def stream(self, request: "Request",
               handed: Handed | None = None) -> AsyncGenerator[str, None]: ...

    async def list_models(self) -> list[str]: ...

    async def load(self) -> "LoadResult | None": ...

    async def probe(self) -> str: ...

    async def advertise(self) -> None: ...

    async def prefill(self, request: "Request") -> int: ...


class Basics:
    """What a provider without a capability has in its place: no load
    known, nothing advertised; a probe it cannot run is an error."""

    capabilities = Capabilities()
    advertised_at = float("-inf")
    rtt_ms: float | None = None
    free_accelerator_bytes: int | None = None

    async def load(self) -> "LoadResult | None":
        return None

    async def probe(self) -> str:
        raise NotImplementedError("no probe: see capabilities")

    async def advertise(self) -> None:
        return None

    async def prefill(self, request: "Request") -> int:
        raise NotImplementedError("no prefill: see capabilities")
