"""ollama-style registries: OCI distribution manifests and blobs.

    GET {registry}/v2/{namespace}/{model}/manifests/{tag}
        Accept: application/vnd.docker.distribution.manifest.v2+json
    GET {registry}/v2/{namespace}/{model}/blobs/sha256:{hex}

The weights are the layer of media type application/vnd.ollama.image.model;
its digest and size are what the bytes are checked against. A registry named
in the reference is spoken to over https (http with --insecure); without
one, the configured endpoint is used.
"""

import json
from typing import Any, ClassVar

import httpx

from syntrop.modeld import names, refs
from syntrop.pull.registries.base import (
    Artifact,
    RegistryError,
    Settings,
    status_error,
    transport_error,
)

MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json"
)
MODEL_LAYER = "application/vnd.ollama.image.model"
MAX_MANIFEST = 4 << 20


class Ollama:
    reference: ClassVar[type] = refs.OllamaRef

    def __init__(self, settings: Settings, client: httpx.Client) -> None:
        self.settings = settings
        self.client = client

    def base(self, reference: refs.OllamaRef) -> str:
        if reference.registry:
            scheme = "http" if self.settings.insecure else "https"
            return f"{scheme}://{reference.registry}"
        if not self.settings.ollama_endpoint:
            raise RegistryError(
                f"{reference}: no ollama registry configured (name one in the reference, "
                "set SYNTROP_OLLAMA_ENDPOINT, or endpoint in [ollama] of pull.toml)"
            )
        return self.settings.ollama_endpoint.rstrip("/")

    def resolve(self, reference: refs.OllamaRef) -> Artifact:
        base = f"{self.base(reference)}/v2/{reference.namespace}/{reference.model}"
        what = str(reference)
        try:
            with self.client.stream(
                "GET", f"{base}/manifests/{reference.tag}",
                headers={"Accept": MANIFEST_TYPES}, follow_redirects=True,
            ) as response:
                if response.status_code >= 400:
                    raise status_error(response, what)
                body = b""
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_MANIFEST:
                        raise RegistryError(f"{what}: the manifest is larger than 4 MiB")
        except httpx.TransportError as error:
            raise transport_error(error, what) from None
        layer = model_layer(body, what)
        digest = names.digest(layer["digest"])
        return Artifact(
            url=f"{base}/blobs/sha256:{digest}", sha256=digest, size=layer["size"],
            filename=f"{reference.model}-{reference.tag}.gguf",
        )


def model_layer(body: bytes, what: str) -> dict[str, Any]:
    """The model layer of a manifest, checked; RegistryError otherwise."""
    try:
        manifest = json.loads(body)
    except (ValueError, RecursionError):
        raise RegistryError(f"{what}: the manifest is not JSON") from None
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise RegistryError(f"{what}: the manifest has no layers")
    for layer in layers:
        if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER:
            digest, size = layer.get("digest"), layer.get("size")
            if not isinstance(digest, str) or not digest.startswith("sha256:"):
                raise RegistryError(f"{what}: the model layer has no sha256 digest")
            try:
                names.digest(digest)
            except names.InvalidDigest:
                raise RegistryError(f"{what}: the model layer's digest is malformed") from None
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise RegistryError(f"{what}: the model layer has no size")
            return layer
    raise RegistryError(f"{what}: the manifest has no model layer ({MODEL_LAYER})")
