"""Providers: where routerd sends a request. One module per kind; REGISTRY
maps a configured kind to its class.

A provider answers OpenAI-shaped objects: `complete` the whole response of
/v1/chat/completions, /v1/completions or /v1/embeddings (an object, or the
JSON text an upstream sent, already checked), `stream` the JSON text of each
chunk (the data of one server-sent event, without the final [DONE]).
"""

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from syntrop.config import Paths
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


def _openai(config: ProviderConfig, paths: Paths) -> Provider:
    from syntrop.routerd.providers.openai import OpenAIProvider

    return OpenAIProvider(config)


def _runtimed(config: ProviderConfig, paths: Paths) -> Provider:
    from syntrop.routerd.providers.runtimed import RuntimedProvider

    return RuntimedProvider(config, paths)


def _peer(config: ProviderConfig, paths: Paths) -> Provider:
    from syntrop.routerd.providers.peer import PeerProvider

    return PeerProvider(config)


REGISTRY: dict[str, Callable[[ProviderConfig, Paths], Provider]] = {
    "openai": _openai,
    "runtimed": _runtimed,
    "peer": _peer,
}
