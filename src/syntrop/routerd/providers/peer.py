"""A LAN peer: another routerd, reached over HTTPS with mutual TLS (its
`endpoint`, our client certificate `tls_cert`/`tls_key`, its CA `tls_ca`).
It serves the same OpenAI API; its GET /health advertises its health and
free accelerator memory, and the time that takes is its round-trip time."""

import json
import os
import time
from typing import Any

from syntrop.routerd.providers.base import MAX_STATE_BYTES, Capabilities, ProviderError
from syntrop.routerd.providers.openai import OpenAIProvider


class PeerProvider(OpenAIProvider):
    #: The peer serves what we forward with its own providers (http.py).
    headers = ((b"x-syntrop-forwarded", b"1"),)
    #: It advertises itself, and continues an answer begun
    #: (continue_final_message), as runtimed.
    capabilities = Capabilities(advertise=True, continues=True, prefill=True)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.rtt_ms: float | None = None
        self.free_accelerator_bytes: int | None = None
        self.advertised_at = float("-inf")

    async def advertise(self) -> None:
        """Ask the peer's /health; ProviderError when it is not healthy."""
        started = time.monotonic()
        exchange = await self._open("GET", "/health", None, root=True)
        try:
            raw = await exchange.read_all()
        finally:
            exchange.close()
        self.rtt_ms = round((time.monotonic() - started) * 1000, 2)
        self.advertised_at = time.monotonic()
        try:
            health = json.loads(raw)
            ok = exchange.status == 200 and health["status"] == "ok"
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise ProviderError(502, f"peer unhealthy (answered {exchange.status})")
        free = health.get("free_accelerator_bytes")
        self.free_accelerator_bytes = free if isinstance(free, int) else None

    async def prefill(self, body: dict[str, Any]) -> int:
        """A chat request's prompt prefilled by the peer's runtimed (its
        POST /v1/syntrop/prefill, handoff.py): the state it streams back,
        copied as it comes into a memfd, the caller's, sealed against
        writes, shrinking and growth (runtimed takes no other)."""
        import fcntl

        exchange = await self._open("POST", "/syntrop/prefill", json.dumps(body).encode())
        fd = os.memfd_create("syntrop-handoff", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            try:
                if exchange.status != 200:
                    raise await self._failed(exchange)
                received = 0
                async for part in exchange.body():
                    received += len(part)
                    if received > MAX_STATE_BYTES:
                        raise ProviderError(502, "the peer's prefill state is too large")
                    view = memoryview(part)
                    while view:
                        view = view[os.write(fd, view):]
            finally:
                exchange.close()
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        except BaseException:
            os.close(fd)
            raise
        return fd
