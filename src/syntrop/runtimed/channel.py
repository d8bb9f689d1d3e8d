"""Messages between runtimed and its engine workers.

A worker and runtimed share one AF_UNIX SOCK_SEQPACKET socketpair: every
message is one packet, a JSON object, with up to MAX_FDS descriptors attached
(SCM_RIGHTS: model weights, adapters, spilled session state). JSON, not
pickle: a worker runs llama.cpp on files from outside, and what comes back
from it must not be able to run code in runtimed. A message longer than
INLINE goes in a sealed memfd attached to a short packet, so packets stay
within the socket's buffer whatever the payload (embeddings, long prompts).

`Endpoint` is the worker's side (blocking, thread-safe sends); `Link` is
runtimed's (asyncio: non-blocking, sends queued while the worker is slow or
frozen, so the event loop never blocks on a worker).
"""

import asyncio
import collections
import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

#: Largest message sent inline; longer ones travel in a memfd.
INLINE = 60 * 1024
#: Most descriptors one message carries.
MAX_FDS = 8
#: Packet kinds (first byte).
_JSON, _MEMFD = b"J", b"M"
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE

Message = dict[str, Any]


class ProtocolError(Exception):
    """A packet that is not a message of ours."""


def pair() -> tuple[socket.socket, socket.socket]:
    """runtimed's end and the worker's end (inheritable)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    return ours, theirs


def encode(message: Message) -> tuple[bytes, int | None]:
    """A packet for `message`, and a memfd carrying it when it is long (the
    caller closes it once sent)."""
    data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    if len(data) <= INLINE:
        return _JSON + data, None
    fd = os.memfd_create("syntrop-message", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return _MEMFD, fd


def decode(packet: bytes, fds: list[int]) -> tuple[Message, list[int]]:
    """The message in `packet` and the descriptors that came with it (the
    memfd of a long message is read and closed)."""
    if packet[:1] == _JSON:
        data = packet[1:]
    elif packet[:1] == _MEMFD and fds:
        body = fds.pop(0)
        try:
            size = os.fstat(body).st_size
            data = os.pread(body, size, 0) if size else b""
        finally:
            os.close(body)
    else:
        raise ProtocolError(f"packet of kind {packet[:1]!r}")
    try:
        message = json.loads(data)
    except ValueError as error:
        raise ProtocolError(f"not JSON: {error}") from None
    if not isinstance(message, dict):
        raise ProtocolError("not a JSON object")
    return message, fds


def _receive(sock: socket.socket) -> tuple[bytes, list[int]] | None:
    """One packet and its descriptors; None at end of stream. Raises
    BlockingIOError on a non-blocking socket with nothing to read."""
    packet, ancillary, flags, _ = sock.recvmsg(INLINE + 1, socket.CMSG_SPACE(MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(int.from_bytes(data[i:i + 4], "little", signed=True)
                       for i in range(0, usable, 4))
    for fd in fds:
        os.set_inheritable(fd, False)
    if not packet and not fds:
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ProtocolError("truncated packet")
    return packet, fds


def _ancillary(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
    if not fds:
        return []
    if len(fds) > MAX_FDS:
        raise ValueError(f"at most {MAX_FDS} descriptors a message")
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
             b"".join(fd.to_bytes(4, "little", signed=True) for fd in fds))]


class Endpoint:
    """A worker's end: blocking; `send` may be called from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        packet, body = encode(message)
        attached = [body, *fds] if body is not None else list(fds)
        try:
            with self._lock:
                self.sock.sendmsg([packet], _ancillary(attached))
        finally:
            if body is not None:
                os.close(body)

    def receive(self) -> tuple[Message, list[int]] | None:
        """The next message; None when runtimed has gone."""
        received = _receive(self.sock)
        return None if received is None else decode(*received)


class Link:
    """runtimed's end, on the event loop. `on_message` gets each message and
    its descriptors (it owns them); `on_close` runs once, at end of stream or
    on a protocol error."""

    def __init__(self, sock: socket.socket,
                 on_message: Callable[[Message, list[int]], None],
                 on_close: Callable[[str], None]) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self._on_message = on_message
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()
        #: Packets waiting for room in the socket, with the descriptors
        #: (our duplicates) to attach and close.
        self._queue: collections.deque[tuple[bytes, list[int]]] = collections.deque()
        self._writing = False
        self.closed = False
        self._loop.add_reader(sock.fileno(), self._readable)

    def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        """Send, or queue until the worker reads; the caller may close `fds`
        as soon as this returns. Raises BrokenPipeError once closed."""
        if self.closed:
            raise BrokenPipeError("the worker has gone")
        packet, body = encode(message)
        owned = ([body] if body is not None else []) + [os.dup(fd) for fd in fds]
        self._queue.append((packet, owned))
        if not self._writing:
            self._flush()

    def _flush(self) -> None:
        while self._queue:
            packet, owned = self._queue[0]
            try:
                self.sock.sendmsg([packet], _ancillary(owned))
            except BlockingIOError:
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(self.sock.fileno(), self._flush)
                return
            except OSError as error:
                self.close(f"send failed: {error}")
                return
            self._queue.popleft()
            for fd in owned:
                os.close(fd)
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        while not self.closed:
            try:
                received = _receive(self.sock)
            except (BlockingIOError, InterruptedError):
                return
            except (OSError, ProtocolError) as error:
                self.close(f"receive failed: {error}")
                return
            if received is None:
                self.close("end of stream")
                return
            try:
                message, fds = decode(*received)
            except (OSError, ProtocolError) as error:
                for fd in received[1]:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self.close(f"bad message: {error}")
                return
            try:
                self._on_message(message, fds)
            except Exception:  # a handler's bug must not stop the link
                logger.exception("handling a message from an engine worker failed")

    def close(self, why: str = "closed") -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self.sock.fileno())
        if self._writing:
            self._loop.remove_writer(self.sock.fileno())
        for _, owned in self._queue:
            for fd in owned:
                os.close(fd)
        self._queue.clear()
        self.sock.close()
        self._on_close(why)
