"""Where pulled bytes come from: one module per registry kind, each turning a
reference into an `Artifact` (a URL to GET, the SHA-256 and size the
registry vouches for, the headers to send), plus `REGISTRIES`, keyed by the
reference type (as cockpit's channels/ keys channel types).

This runs in the client (`syn pull`), not in modeld: the daemon's unit has
no network. The HTTP client is passed in (httpx.Client), so tests point it
at loopback servers and nothing here knows a host name: endpoints come from
`Settings` (pull.toml, HF_ENDPOINT, SYNTROP_OLLAMA_ENDPOINT).
"""

from typing import TYPE_CHECKING

from syntrop.modeld import refs
from syntrop.pull.registries.base import (
    Artifact,
    Registry,
    RegistryError,
    Settings,
    status_error,
    transport_error,
)
from syntrop.pull.registries.hf import HuggingFace
from syntrop.pull.registries.ollama import Ollama
from syntrop.pull.registries.web import Web

if TYPE_CHECKING:
    import httpx

__all__ = [
    "REGISTRIES", "Artifact", "Registry", "RegistryError", "Settings", "registry_for",
    "status_error", "transport_error",
]

#: Registry kinds by the reference type they resolve.
REGISTRIES: dict[type, type[Registry]] = {
    kind.reference: kind for kind in (HuggingFace, Ollama, Web)
}


def registry_for(reference: refs.Reference, settings: Settings, client: "httpx.Client") -> Registry:
    kind = REGISTRIES.get(type(reference))
    if kind is None:
        raise RegistryError(f"{reference}: not a registry reference")
    return kind(settings, client)
