"""Hugging Face-style repositories: {endpoint}/{org}/{repo}/resolve/{revision}/{file}.

As huggingface_hub does: a HEAD without following redirects gives the file's
SHA-256 in X-Linked-Etag (LFS files; the 302 points at the storage that
serves the bytes) and its size in X-Linked-Size; a relative redirect
(a renamed repository) is followed. Files outside LFS carry a git SHA-1 in
their ETag, which verifies nothing here: those need --sha256. HF_TOKEN, if
set, is sent as a bearer token.
"""

import re
from typing import ClassVar
from urllib.parse import quote, urljoin, urlsplit

import httpx

from syntrop.modeld import refs
from syntrop.pull.registries.base import (
    Artifact,
    RegistryError,
    Settings,
    status_error,
    transport_error,
)

_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_REDIRECTS = 5


def etag_sha256(value: str | None) -> str | None:
    """The SHA-256 in an ETag (W/"…" or "…"), if it is one."""
    if not value:
        return None
    value = value.strip().removeprefix("W/").strip('"').lower()
    return value if _SHA256.fullmatch(value) else None


def _size(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


class HuggingFace:
    reference: ClassVar[type] = refs.HfRef

    def __init__(self, settings: Settings, client: httpx.Client) -> None:
        self.settings = settings
        self.client = client

    def resolve(self, reference: refs.HfRef) -> Artifact:
        endpoint = self.settings.hf_endpoint
        if not endpoint:
            raise RegistryError(
                f"{reference}: no Hugging Face endpoint configured "
                "(set HF_ENDPOINT, or endpoint in [hf] of pull.toml)"
            )
        headers = {"Accept-Encoding": "identity"}
        if self.settings.hf_token:
            headers["Authorization"] = f"Bearer {self.settings.hf_token}"
        url = (
            f"{endpoint.rstrip('/')}/{reference.repo_id}/resolve/"
            f"{quote(reference.revision, safe='')}/{quote(reference.filename)}"
        )
        what = str(reference)
        for _ in range(MAX_REDIRECTS + 1):
            try:
                response = self.client.head(url, headers=headers, follow_redirects=False)
            except httpx.TransportError as error:
                raise transport_error(error, what) from None
            location = response.headers.get("location")
            if response.is_redirect and location and not urlsplit(location).netloc:
                url = urljoin(url, location)
                continue
            break
        else:
            raise RegistryError(f"{what}: too many redirects")
        if response.status_code >= 400:
            raise status_error(
                response, what, auth_hint="gated or private repositories need HF_TOKEN"
            )
        sha256 = etag_sha256(response.headers.get("x-linked-etag")) or etag_sha256(
            response.headers.get("etag")
        )
        size = _size(response.headers.get("x-linked-size")) or _size(
            response.headers.get("content-length")
        )
        return Artifact(
            url=url, sha256=sha256, size=size,
            filename=reference.filename.rsplit("/", 1)[-1], headers=headers,
        )
