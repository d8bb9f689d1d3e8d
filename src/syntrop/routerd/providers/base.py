"""What every provider is: the Provider protocol and ProviderError (the
provider modules import this, not the package, which imports them)."""

from collections.abc import AsyncIterator
from typing import Any, Protocol

from syntrop.routerd.config import ProviderConfig


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


class Provider(Protocol):
    config: ProviderConfig

    async def complete(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any] | bytes: ...

    def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[str]: ...

    async def list_models(self) -> list[str]: ...
