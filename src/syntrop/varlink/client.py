"""Typed clients: one call gives a proxy for io.syntrop.<Name>1.

    async with await connect(Inference1) as inference:
        topology = await inference.GetTopology()

What a method takes and returns is the contract's, as
syntrop/interfaces/clients.py spells it for mypy (generated from the
contracts); a declared error arrives as the contract's error class (asyncvarlink
decodes it from the contract's `errors`), one of org.varlink.service's as
asyncvarlink.serviceerrors', any other as GenericVarlinkErrorReply.

The socket is $RUNTIME_DIRECTORY/<interface name> unless an address is
given. Every call has a timeout (default 45 s, sd-varlink's); a streaming call
applies it to each reply. A call that times out closes the connection: its
reply could otherwise arrive as the answer to the next call.
"""

import asyncio
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Self, overload

from asyncvarlink import (
    GenericVarlinkErrorReply,
    TypedVarlinkErrorReply,
    VarlinkClientProtocol,
    VarlinkErrorReply,
    VarlinkInterface,
    VarlinkTransport,
    serviceerrors,
)
from asyncvarlink import connect_unix_varlink as _connect
from asyncvarlink.conversion import ConversionError

from syntrop.config import paths

if TYPE_CHECKING:
    from syntrop.interfaces import clients
    from syntrop.interfaces.context import Context1
    from syntrop.interfaces.inference import Inference1
    from syntrop.interfaces.model import Model1
    from syntrop.interfaces.router import Router1
    from syntrop.interfaces.runtime import Runtime1
    from syntrop.interfaces.sentry import Sentry1
    from syntrop.interfaces.tool import Tool1

DEFAULT_TIMEOUT = 45.0

#: org.varlink.service's errors (InvalidParameter, PermissionDenied, ...):
#: any interface may answer them, so every client decodes them as well.
_STANDARD: dict[str, type[TypedVarlinkErrorReply]] = {error.name: error for error in (
    serviceerrors.InterfaceNotFound, serviceerrors.MethodNotFound,
    serviceerrors.MethodNotImplemented, serviceerrors.InvalidParameter,
    serviceerrors.PermissionDenied, serviceerrors.ExpectedMore)}


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
        except GenericVarlinkErrorReply as error:
            raise _standard(error) from None
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
            except GenericVarlinkErrorReply as error:
                raise _standard(error) from None
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


def _standard(error: GenericVarlinkErrorReply) -> VarlinkErrorReply:
    """`error` as org.varlink.service's class when it is one of those."""
    known = _STANDARD.get(error.name)
    if known is None:
        return error
    try:
        return known(known.paramtype.fromjson(error.parameters))
    except ConversionError:  # parameters not as the standard says: keep them
        return error


def _seen(future: "asyncio.Future[Any]") -> None:
    if not future.cancelled():
        future.exception()


def address_of(interface: type[VarlinkInterface]) -> str:
    """Where `interface` is served: $RUNTIME_DIRECTORY/<name>."""
    return os.fspath(paths().socket(interface.name))


_Address = str | os.PathLike[str] | None


@overload
async def connect(interface: "type[Context1]", *, address: _Address = None,
                  timeout: float = DEFAULT_TIMEOUT) -> "clients.Context1Client": ...
@overload
async def connect(interface: "type[Inference1]", *, address: _Address = None,
                  timeout: float = DEFAULT_TIMEOUT) -> "clients.Inference1Client": ...
@overload
async def connect(interface: "type[Model1]", *, address: _Address = None,
                  timeout: float = DEFAULT_TIMEOUT) -> "clients.Model1Client": ...
@overload
async def connect(interface: "type[Router1]", *, address: _Address = None,
                  timeout: float = DEFAULT_TIMEOUT) -> "clients.Router1Client": ...
@overload
async def connect(interface: "type[Runtime1]", *, address: _Address = None,
                  timeout: float = DEFAULT_TIMEOUT) -> "clients.Runtime1Client": ...
@overload
async def connect(interface: "type[Sentry1]", *, address: _Address = None,
                  timeout: float = DEFAULT_TIMEOUT) -> "clients.Sentry1Client": ...
@overload
async def connect(interface: "type[Tool1]", *, address: _Address = None,
                  timeout: float = DEFAULT_TIMEOUT) -> "clients.Tool1Client": ...
@overload
async def connect(interface: type[VarlinkInterface], *, address: _Address = None,
                  timeout: float = DEFAULT_TIMEOUT) -> Any: ...  # another (a test's): untyped
async def connect(
    interface: type[VarlinkInterface],
    *,
    address: _Address = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Any:
    """Connect to the daemon serving `interface` (a contract class): a
    Client, typed as that contract's client in syntrop.interfaces.clients."""
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
