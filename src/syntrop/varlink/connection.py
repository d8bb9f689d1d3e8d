"""One connection of the Varlink server (syntrop.varlink.server): reading,
dispatch, streamed replies and writing, in one class, since every message
passes through all of them and they share the connection's fields.

Ordering: one call at a time per connection, as sd-varlink does. While a call
runs, the connection stops reading (back pressure); pipelined calls wait in
the input buffer. A streaming call whose client does not read is suspended
once its pending output passes a high-water mark.

Errors: anything that is not a Varlink call (bad JSON, no NUL within the
message limit, bad method string) closes that one connection. A call that
fails validation gets org.varlink.service.InvalidParameter naming the
parameter. A method that raises a declared error has it sent; anything else
is logged with its traceback and answered with a generic error naming no
internals.
"""

import array
import asyncio
import collections
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

from asyncvarlink import (
    AnnotatedResult,
    GenericVarlinkErrorReply,
    VarlinkErrorReply,
    VarlinkMethodCall,
    VarlinkMethodSignature,
)
from asyncvarlink.conversion import ConversionError, FileDescriptorVarlinkType
from asyncvarlink.serviceinterface import InvalidParameter
from asyncvarlink.types import FileDescriptorArray

from syntrop.varlink.flat import converter
from syntrop.varlink.limits import Limits, MiB
from syntrop.varlink.peer import Peer, reset_current, set_current
from syntrop.varlink.strict import SURROGATE_ESCAPE, boolean_as_number, has_lone_surrogate

logger = logging.getLogger(__name__)

_RECV_SIZE = 64 * 1024
_MAX_FDS_PER_MESSAGE = 253  # SCM_MAX_FD
_HIGH_WATER = 4 * MiB
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_DECODER = json.JSONDecoder()
#: A plain int: `flags & socket.MSG_CTRUNC` would go through IntFlag.__and__.
_MSG_CTRUNC = int(socket.MSG_CTRUNC)
_ANCBUF = socket.CMSG_SPACE(_MAX_FDS_PER_MESSAGE * 4)
#: oobstate for a conversion that must not meet a file descriptor: one that
#: does raises ConversionError, and the caller retries with a real array.
_NO_FDS: dict[Any, Any] = {}


def internal_error(method: str) -> VarlinkErrorReply:
    """The InternalError of `method`'s interface (every contract declares
    one: syntrop.varlink.contract.internal_error)."""
    return GenericVarlinkErrorReply(f"{method.rpartition('.')[0]}.InternalError",
                                    {"method": method})


class Owner(Protocol):
    """What a connection uses of the server holding it."""

    loop: asyncio.AbstractEventLoop
    limits: Limits
    #: method string -> (callable, signature) of plain calls looked up before.
    methods: dict[str, tuple[Callable[..., Any], VarlinkMethodSignature]]
    tasks: set[asyncio.Task[None]]

    def lookup_method(
        self, call: VarlinkMethodCall
    ) -> tuple[Callable[..., Any], VarlinkMethodSignature]: ...

    def account(self, connection: "Connection", size: int) -> bool: ...

    def check_idle(self) -> None: ...

    def connection_closed(self, connection: "Connection") -> None: ...


_EMPTY: dict[str, Any] = {}


def _nothing() -> None:
    pass


class _PlainCall:
    """A call with no flags and no extensions, as the fast path sees it."""

    __slots__ = ("method", "parameters")
    oneway = more = upgrade = False

    def __init__(self, method: str, parameters: dict[str, Any]) -> None:
        self.method = method
        self.parameters = parameters


class Connection:
    """One accepted (or inherited) stream socket."""

    def __init__(self, server: Owner, sock: socket.socket, peer: Peer) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.loop = server.loop
        self.inbuf = bytearray()
        #: len(inbuf) as the server's per-uid accounting knows it.
        self.accounted = 0
        self.partial_timer: asyncio.TimerHandle | None = None
        self.infds: list[int] = []
        self.outq: collections.deque[tuple[memoryview, list[int], Callable[[], None] | None]] = (
            collections.deque()
        )
        self.outbytes = 0
        self.task: asyncio.Task[None] | None = None
        #: The method of the call being answered (one at a time).
        self.method = ""
        self.current_more = False
        self.reading = False
        self.eof = False
        self.closed = False
        self.drained: asyncio.Future[None] | None = None
        sock.setblocking(False)
        self._resume_reading()

    # reading -------------------------------------------------------------

    def _resume_reading(self) -> None:
        if not self.reading and not self.eof and not self.closed:
            self.loop.add_reader(self.fd, self._on_readable)
            self.reading = True

    def _pause_reading(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _on_readable(self) -> None:
        if self.task is not None:
            # Input while a call runs waits in the kernel until it is done.
            # Paused only now, not when the call began: a client that waits
            # for each reply (most do) costs no epoll_ctl per call.
            self._pause_reading()
            return
        try:
            data, ancdata, flags, _ = self.sock.recvmsg(_RECV_SIZE, _ANCBUF)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            logger.debug("connection from pid %d: read failed: %s", self.peer.pid, error)
            self.close()
            return
        if ancdata:
            for level, kind, cdata in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
                    self.infds.extend(fds)
        if flags & _MSG_CTRUNC:
            logger.debug("connection from pid %d: too many fds, closing", self.peer.pid)
            self.close()
            return
        if not data:
            self._on_eof()
            return
        self.inbuf += data
        self._process()

    def _on_eof(self) -> None:
        self.eof = True
        self._pause_reading()
        if self.task is None:
            if not self.inbuf and not self.outq:
                self.close()
            else:
                self._process()
        elif self.current_more:
            # A client that stops sending while expecting a stream has gone.
            self.task.cancel()

    def _process(self) -> None:
        """Run complete calls from the input buffer until one goes async."""
        limit = self.server.limits.max_message
        while self.task is None and not self.closed:
            end = self.inbuf.find(b"\0")
            if end < 0:
                if len(self.inbuf) > limit:
                    logger.info(
                        "connection from pid %d: message over %d bytes, closing",
                        self.peer.pid, limit,
                    )
                    self.close()
                elif self.eof:
                    self.close()
                self._arm_partial()
                return
            if end > limit:
                self.close()
                return
            message = self.inbuf[:end]
            del self.inbuf[: end + 1]
            fds, self.infds = self.infds, []
            self._dispatch(message, fds)
        if self.task is None and self.eof and not self.outq and not self.closed:
            self.close()
        self._arm_partial()

    def _arm_partial(self) -> None:
        """After input was read or consumed: account what is left unfinished
        (closing the connection when that is over its uid's or the daemon's
        cap), and keep a timer while a message is unfinished."""
        if len(self.inbuf) != self.accounted and not self.closed and \
                not self.server.account(self, len(self.inbuf)):
            logger.info("connection from pid %d uid %d: buffered input over its cap, closing",
                        self.peer.pid, self.peer.uid)
            self.close()
            return
        if self.inbuf and not self.closed:
            if self.partial_timer is None:
                self.partial_timer = self.loop.call_later(
                    self.server.limits.partial_timeout, self._partial_expired)
        elif self.partial_timer is not None:
            self.partial_timer.cancel()
            self.partial_timer = None

    def _partial_expired(self) -> None:
        self.partial_timer = None
        if self.closed or not self.inbuf:
            return
        if self.task is not None:
            self._arm_partial()  # pipelined input waiting for a call: not the client's stall
            return
        logger.info("connection from pid %d: a message unfinished after %g s, closing",
                    self.peer.pid, self.server.limits.partial_timeout)
        self.close()

    # calls -----------------------------------------------------------------

    def _parse(self, message: bytes | bytearray
               ) -> tuple["VarlinkMethodCall | _PlainCall", tuple[Any, Any] | None]:
        """The call in a message, and its (method, signature) when the fast
        path found them: a plain call ({"method", "parameters"} only, no
        oneway/more/upgrade/extensions) of a method looked up before.
        Anything else goes through asyncvarlink's full validation. Raises
        ValueError, TypeError or RecursionError for what is not a call."""
        text = message.decode()
        try:
            # raw_decode skips json.loads' two whitespace regex matches;
            # anything it does not take whole goes to json.loads.
            obj, index = _DECODER.raw_decode(text)
        except ValueError:
            index = -1
        if index != len(text):
            obj = json.loads(text)
        if type(obj) is dict and 0 < len(obj) <= 2:
            found = self.server.methods.get(obj.get("method"))  # type: ignore[arg-type]
            parameters = obj.get("parameters", _EMPTY)
            if found is not None and type(parameters) is dict and \
                    len(obj) == (2 if "parameters" in obj else 1):
                return _PlainCall(obj["method"], parameters), found
        return VarlinkMethodCall.fromjson(obj), None

    def _arguments(self, call: "VarlinkMethodCall | _PlainCall", found: tuple[Any, Any] | None,
                   fdarray: FileDescriptorArray | None
                   ) -> tuple[Callable[..., Any], VarlinkMethodSignature, dict[str, Any]]:
        """The method, its signature and the call's converted parameters;
        a VarlinkErrorReply for what the contract does not take."""
        if found is None:
            assert isinstance(call, VarlinkMethodCall)
            method, signature = self.server.lookup_method(call)
        else:
            method, signature = found
        if call.upgrade:
            raise InvalidParameter(parameter="upgrade")
        try:
            params = converter(signature.parameter_type).fromjson(
                call.parameters, {FileDescriptorVarlinkType: fdarray}
            )
        except ConversionError as error:
            where = str(error.location[0]) if error.location else "parameters"
            raise InvalidParameter(parameter=where) from None
        stray = boolean_as_number(signature.parameter_type, call.parameters)
        if stray is not None:
            raise InvalidParameter(parameter=stray)
        return method, signature, params

    def _call_now(self, call: "VarlinkMethodCall | _PlainCall", method: Callable[..., Any],
                  signature: VarlinkMethodSignature, params: dict[str, Any]) -> None:
        """A synchronous method without `more`: run and answered at once."""
        try:
            result = method(**params)
        except VarlinkErrorReply as error:
            if not call.oneway:
                self._send_error(error)
        except Exception:
            logger.exception("%s failed", call.method)
            if not call.oneway:
                self._send_error(internal_error(call.method))
        else:
            if not call.oneway:
                self._send_result(signature, result)

    def _dispatch(self, message: bytes | bytearray, fds: list[int]) -> None:
        try:
            call, found = self._parse(message)
        except (ValueError, TypeError, RecursionError):
            for fd in fds:
                os.close(fd)
            logger.info("connection from pid %d: not a Varlink call, closing", self.peer.pid)
            self.close()
            return
        if fds:
            sentinel = object()
            fdarray: FileDescriptorArray | None = FileDescriptorArray(sentinel, fds)

            def release() -> None:
                fdarray.release(sentinel)  # type: ignore[union-attr]
        else:
            fdarray = None
            release = _nothing

        self.method = call.method
        try:
            method, signature, params = self._arguments(call, found, fdarray)
            if SURROGATE_ESCAPE.search(message) is not None:
                lone = [name for name, value in call.parameters.items()
                        if has_lone_surrogate(value)]
                if lone:
                    raise InvalidParameter(parameter=lone[0])
        except VarlinkErrorReply as error:
            release()
            if not call.oneway:
                self._send_error(error)
            return

        token = set_current(self.peer)
        try:
            if not signature.asynchronous and not signature.more:
                try:
                    self._call_now(call, method, signature, params)
                finally:
                    if fdarray is not None:
                        release()
                return
            # The task copies the context now, peer included.
            self.current_more = signature.more
            self.task = self.loop.create_task(self._run(call, method, signature, params))
            if fdarray is not None:
                self.task.add_done_callback(lambda _: release())
            self.task.add_done_callback(self._call_done)
            self.server.tasks.add(self.task)
        finally:
            reset_current(token)

    async def _run(
        self,
        call: "VarlinkMethodCall | _PlainCall",
        method: Callable[..., Any],
        signature: VarlinkMethodSignature,
        params: dict[str, Any],
    ) -> None:
        try:
            if signature.more:
                results = method(**params)
                if signature.asynchronous:
                    async for result in results:
                        await self._send_streamed(signature, result)
                else:
                    for result in results:
                        await self._send_streamed(signature, result)
            else:
                result = method(**params)
                if signature.asynchronous:
                    result = await result
                if not call.oneway:
                    self._send_result(signature, result)
        except VarlinkErrorReply as error:
            if not call.oneway:
                self._send_error(error)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:
            logger.exception("%s failed", call.method)
            if not call.oneway:
                self._send_error(internal_error(call.method))
        # Answered: the connection goes on now, in this loop iteration, not
        # from the task's done callback in the next one (a loop iteration
        # less per call; a lone client's lease pair pays five per call).
        self._finished(asyncio.current_task())

    async def _send_streamed(self, signature: VarlinkMethodSignature, result: Any) -> None:
        if self.closed:
            raise ConnectionResetError("client went away")
        self._send_result(signature, result)
        if self.outbytes > _HIGH_WATER and not self.closed:
            self.drained = self.loop.create_future()
            await self.drained

    def _call_done(self, task: asyncio.Task[None]) -> None:
        self.server.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exception = task.exception()
            if not isinstance(exception, ConnectionError):
                logger.error("call task failed", exc_info=exception)
        self._finished(task)

    def _finished(self, task: "asyncio.Task[Any] | None") -> None:
        """The call of `task` is over: take the next one from the buffer, or
        read again. Once per call: from the end of the call itself, or from
        the task's done callback when the call ended by an exception or
        was cancelled (a task cancelled before it started runs no code)."""
        if task is None or self.task is not task:
            return  # done already (the next call may be running)
        self.server.tasks.discard(task)
        self.task = None
        self.current_more = False
        if self.closed:
            # Closed while the call ran (the client left, a write failed):
            # close() saw the task still pending and could not arm the idle
            # exit, so do it now that the task is gone.
            self.server.check_idle()
            return
        self._process()
        if self.task is None:
            self._resume_reading()
        self.server.check_idle()

    # writing ---------------------------------------------------------------

    def _send_result(self, signature: VarlinkMethodSignature, result: Any) -> None:
        assert isinstance(result, AnnotatedResult)
        fds: list[int] = []
        done: Callable[[], None] | None = None
        try:
            # Most replies carry no descriptor: convert without an array first.
            parameters = converter(signature.return_type).tojson(result.parameters, _NO_FDS)
        except ConversionError:
            sentinel = object()
            fdarray = FileDescriptorArray(sentinel)
            try:
                parameters = signature.return_type.tojson(
                    result.parameters, {FileDescriptorVarlinkType: fdarray}
                )
            except ConversionError:
                fdarray.release(sentinel)
                logger.exception("reply does not match its declared type")
                self._send_error(internal_error(self.method))
                return
            fds = [fd.fileno() for fd in fdarray]

            def done() -> None:
                fdarray.release(sentinel)

        reply: dict[str, Any] = {"parameters": parameters}
        if result.continues:
            reply["continues"] = True
        if result.extensions:
            reply.update(result.extensions)
        self._write(reply, fds, done)

    def _send_error(self, error: VarlinkErrorReply) -> None:
        try:
            reply = error.tojson()
        except ConversionError:
            logger.exception("error %s does not match its declared type", error.name)
            reply = internal_error(self.method).tojson()
        self._write(reply, [], None)

    def _write(self, obj: dict[str, Any], fds: list[int], done: Callable[[], None] | None) -> None:
        if self.closed:
            if done:
                done()
            return
        try:
            encoded = _ENCODER.encode(obj).encode()
        except UnicodeEncodeError:
            # A lone surrogate that the reply echoes: escaped, the caller
            # still gets its answer (UTF-8 cannot carry it as it is).
            encoded = json.dumps(obj, separators=(",", ":")).encode()
        data = memoryview(encoded + b"\0")
        if not self.outq:
            try:
                sent = socket.send_fds(self.sock, [data], fds) if fds else self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as error:
                logger.debug("connection from pid %d: write failed: %s", self.peer.pid, error)
                if done:
                    done()
                self.close()
                return
            if sent == len(data):
                if done:
                    done()
                return
            if sent:
                data, fds = data[sent:], []
            self.loop.add_writer(self.fd, self._on_writable)
        self.outq.append((data, fds, done))
        self.outbytes += len(data)

    def _on_writable(self) -> None:
        while self.outq:
            data, fds, done = self.outq[0]
            try:
                sent = socket.send_fds(self.sock, [data], fds) if fds else self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                logger.debug("connection from pid %d: write failed: %s", self.peer.pid, error)
                self.close()
                return
            self.outbytes -= sent
            if sent < len(data):
                self.outq[0] = (data[sent:], [], done)
                return
            self.outq.popleft()
            if done:
                done()
        self.loop.remove_writer(self.fd)
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        if self.eof and self.task is None:
            self._process()

    # teardown --------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._pause_reading()
        self.loop.remove_writer(self.fd)
        if self.partial_timer is not None:
            self.partial_timer.cancel()
            self.partial_timer = None
        self.inbuf = bytearray()
        self.server.account(self, 0)
        for _, _, done in self.outq:
            if done:
                done()
        self.outq.clear()
        for fd in self.infds:
            os.close(fd)
        self.infds = []
        if self.drained is not None and not self.drained.done():
            self.drained.set_exception(ConnectionResetError("client went away"))
            self.drained.exception()  # retrieved here; the stream ends
        if self.task is not None:
            self.task.cancel()
        self.sock.close()
        self.server.connection_closed(self)
