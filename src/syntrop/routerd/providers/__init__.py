"""Providers: where routerd sends a request. One module per kind; REGISTRY
maps a configured kind to its class.

A provider answers OpenAI-shaped objects: `complete` the whole response of
/v1/chat/completions, /v1/completions or /v1/embeddings (an object, or the
JSON text an upstream sent, already checked), `stream` the JSON text of each
chunk (the data of one server-sent event, without the final [DONE]).
"""

from collections.abc import Callable

from syntrop.config import Paths
from syntrop.routerd.config import ProviderConfig
from syntrop.routerd.providers.base import Capabilities, Provider, ProviderError


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

__all__ = ["REGISTRY", "Capabilities", "Provider", "ProviderError"]
