"""Typed clients: one call gives a proxy for io.syntrop.<Name>1.

    async with await connect(Inference1) as inference:
        topology = await inference.GetTopology()

The socket is $RUNTIME_DIRECTORY/<interface name> unless an address is
given. Every call has a timeout (default 45 s, sd-varlink's); a streaming call
applies it to each reply. A call that times out closes the connection: its
reply could otherwise arrive as the answer to the next call.
"""

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any, Self

from asyncvarlink import VarlinkClientProtocol, VarlinkInterface, VarlinkTransport
from asyncvarlink import connect_unix_varlink as _connect

from syntrop.config import paths

DEFAULT_TIMEOUT = 45.0


class CallTimeout(TimeoutError):
    """A Varlink call got no reply within its timeout."""


class Client:
    """A connection to one daemon, with the methods of one interface."""

    def __init__(
        self,
        transport: VarlinkTransport,
        protocol: VarlinkClientProtocol,
        interface: type[VarlinkInterface],
        timeout: float,
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._proxy = protocol.make_proxy(interface)
        self._interface = interface
        self.timeout = timeout

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._interface, name, None)
        if method is None or not hasattr(method, "_varlink_signature"):
            raise AttributeError(f"{self._interface.name} has no method {name}")
        proxied = getattr(self._proxy, name)
        if method._varlink_signature.more:
            return lambda **params: self._stream(proxied, params)
        return lambda **params: self._call(proxied, params)

    async def _call(self, proxied: Any, params: dict[str, Any]) -> Any:
        try:
            return await asyncio.wait_for(proxied(**params), self.timeout)
        except TimeoutError:
            self.close()
            raise CallTimeout(f"no reply within {self.timeout:g} s") from None

    async def _stream(self, proxied: Any, params: dict[str, Any]) -> AsyncIterator[Any]:
        replies = proxied(**params).__aiter__()
        while True:
            try:
                reply = await asyncio.wait_for(replies.__anext__(), self.timeout)
            except StopAsyncIteration:
                return
            except TimeoutError:
                self.close()
                raise CallTimeout(f"no reply within {self.timeout:g} s") from None
            yield reply

    def close(self) -> None:
        # Closing while a stream still has replies to come (its consumer
        # left) trips two things in asyncvarlink 0.3.3 (pinned), each logged
        # as an error: the future of the next reply fails with nobody to
        # see it, and replies received until the close takes effect (on the
        # next loop turn) are handed on after the connection has forgotten
        # its calls (IndexError). So: stop reading now, mark that future
        # seen (whoever awaits it still gets the error), and drop what was
        # received and not yet handed on.
        if not self._transport.is_closing():
            self._transport.pause_reading()
        for pending in getattr(self._protocol, "_pending", ()):
            for reply in getattr(pending, "replies", (pending,)):
                future = getattr(reply, "future", None)
                if isinstance(future, asyncio.Future) and not future.done():
                    future.add_done_callback(_seen)
        queue = getattr(self._protocol, "_consumer_queue", None)
        if queue is not None:
            for _, notify in queue:
                if notify is not None and not notify.done():
                    notify.set_result(None)  # releases the fds it holds
            queue.clear()
        self._transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()
        await asyncio.sleep(0)


def _seen(future: "asyncio.Future[Any]") -> None:
    if not future.cancelled():
        future.exception()


def address_of(interface: type[VarlinkInterface]) -> str:
    """Where `interface` is served: $RUNTIME_DIRECTORY/<name>."""
    return os.fspath(paths().socket(interface.name))


async def connect(
    interface: type[VarlinkInterface],
    *,
    address: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Client:
    """Connect to the daemon serving `interface` (a contract class)."""
    path = address_of(interface) if address is None else os.fspath(address)
    if path.startswith("unix:"):
        path = path[len("unix:"):]
    try:
        transport, protocol = await asyncio.wait_for(
            _connect(VarlinkClientProtocol, path), timeout
        )
    except TimeoutError:
        raise CallTimeout(f"cannot connect to {path} within {timeout:g} s") from None
    return Client(transport, protocol, interface, timeout)
