"""Plain https:// (or http://) URLs. Nothing vouches for the bytes but the
SHA-256 the caller gives (--sha256); a HEAD tells the size when the server
answers one."""

from typing import ClassVar
from urllib.parse import unquote, urlsplit

import httpx

from syntrop.modeld import refs
from syntrop.pull.registries.base import Artifact, Settings, status_error, transport_error


class Web:
    reference: ClassVar[type] = refs.UrlRef

    def __init__(self, settings: Settings, client: httpx.Client) -> None:
        self.settings = settings
        self.client = client

    def resolve(self, reference: refs.UrlRef) -> Artifact:
        headers = {"Accept-Encoding": "identity"}
        try:
            response = self.client.head(reference.url, headers=headers, follow_redirects=True)
        except httpx.TransportError as error:
            raise transport_error(error, reference.url) from None
        size = None
        if response.status_code in (405, 501):
            pass  # no HEAD here: the size will be known from the GET
        elif response.status_code >= 400:
            raise status_error(response, reference.url)
        else:
            length = response.headers.get("content-length", "")
            size = int(length) if length.isdigit() and int(length) > 0 else None
        filename = unquote(urlsplit(reference.url).path.rsplit("/", 1)[-1])
        return Artifact(url=reference.url, sha256=None, size=size, filename=filename,
                        headers=headers)
