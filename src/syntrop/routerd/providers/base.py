"""What every provider is: the Provider protocol, the Capabilities it
declares, and ProviderError (the provider modules import this, not the
package, which imports them)."""

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from syntrop.routerd.config import ProviderConfig

if TYPE_CHECKING:
    from syntrop.interfaces.runtime import LoadResult


#: A request body's key for the descriptor of a prefill's KV state that
#: runtimed answers from (Chat's prefix_state; handoff.py). Only the
#: gateway sets it (it drops one a client sends) and closes the descriptor.
STATE = "_syntrop_prefix_state"
#: Most bytes of such a state a node takes from another (a 131,072-token
#: context of SmolLM2 is about 3 GiB).
MAX_STATE_BYTES = 4 << 30


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
    #: (STATE in the body), a fleet member pulls one itself (HANDOFF).
    prefill: bool = False


class Provider(Protocol):
    config: ProviderConfig
    capabilities: Capabilities
    #: When it last advertised (monotonic seconds), what that took, and the
    #: free accelerator memory it named; None, -inf: not known.
    advertised_at: float
    rtt_ms: float | None
    free_accelerator_bytes: int | None

    async def complete(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any] | bytes: ...

    def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncGenerator[str, None]: ...

    async def list_models(self) -> list[str]: ...

    async def load(self) -> "LoadResult | None": ...

    async def probe(self) -> str: ...

    async def advertise(self) -> None: ...

    async def prefill(self, body: dict[str, Any]) -> int: ...


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

    async def prefill(self, body: dict[str, Any]) -> int:
        raise NotImplementedError("no prefill: see capabilities")
