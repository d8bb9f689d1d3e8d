"""A LAN peer: another routerd, reached over HTTPS with mutual TLS (its
`endpoint`, our client certificate `tls_cert`/`tls_key`, its CA `tls_ca`).
It serves the same OpenAI API; its GET /health advertises its health and
free accelerator memory, and the time that takes is its round-trip time."""

import asyncio
import json
import logging
import os
import time
from typing import Any

from syntrop.routerd.providers.base import MAX_STATE_BYTES, Capabilities, Handed, ProviderError
from syntrop.routerd.providers.openai import OpenAIProvider, _Exchange
from syntrop.routerd.request import HANDOFF, Request

logger = logging.getLogger(__name__)

#: Bytes of a pulled state written into runtimed's pipe at a time.
COPY_CHUNK = 64 << 10


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
        #: Pulled states being copied into runtimed's pipes, by read end.
        self.copies: dict[int, asyncio.Task[None]] = {}

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

    def _sent(self, request: Request, handed: Handed | None) -> dict[str, Any]:
        """The body, with the helper of a hand-off planned for this member."""
        body = super()._sent(request, handed)
        helper = handed.helper_for(self.config.id) if handed is not None else None
        return body if helper is None else {**body, HANDOFF: {"from": helper}}

    async def prefill(self, request: Request) -> int:
        """A chat request's prompt prefilled by the peer's runtimed (its
        POST /v1/syntrop/prefill, handoff.py): the read end of a pipe that
        the state it streams back is copied into, COPY_CHUNK bytes at a
        time, as runtimed reads it (its Chat's prefix_state). routerd never
        holds the state: its memory stays flat however large that is.
        The copy (`copies`, by that descriptor) ends at the body's end, at
        a failure (the pipe closes early: runtimed refuses a state cut
        short) or when the reader is gone."""
        body = {k: v for k, v in request.sent().items() if k != "stream"}
        exchange = await self._open("POST", "/syntrop/prefill", json.dumps(body).encode())
        try:
            if exchange.status != 200:
                raise await self._failed(exchange)
            read, write = os.pipe2(os.O_CLOEXEC)
        except BaseException:
            exchange.close()
            raise
        os.set_blocking(write, False)
        task = asyncio.create_task(self._copy(exchange, write))
        self.copies[read] = task
        task.add_done_callback(lambda done: self._copied(read, done))
        return read

    def _copied(self, read: int, task: "asyncio.Task[None]") -> None:
        if self.copies.get(read) is task:
            del self.copies[read]
        if not task.cancelled() and (failure := task.exception()) is not None:
            logger.warning("prefill hand-off from %s cut short: %s", self.config.id,
                           getattr(failure, "message", failure))

    async def _copy(self, exchange: "_Exchange", write: int) -> None:
        """The response's body into the pipe `write` (closed at the end)."""
        received = 0
        try:
            async for part in exchange.body():
                received += len(part)
                if received > MAX_STATE_BYTES:
                    raise ProviderError(502, "the peer's prefill state is too large")
                if not await copy_into(write, part):
                    return  # runtimed stopped reading (or never began): nothing to do
        finally:
            exchange.close()
            os.close(write)


async def copy_into(fd: int, data: bytes) -> bool:
    """Write `data` into the non-blocking pipe `fd`, at most COPY_CHUNK bytes
    per write, waiting while the pipe is full; False when its reader is gone."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view[:COPY_CHUNK]):]
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _settle, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)
        except BrokenPipeError:
            return False
    return True


def _settle(ready: "asyncio.Future[None]") -> None:
    if not ready.done():
        ready.set_result(None)
