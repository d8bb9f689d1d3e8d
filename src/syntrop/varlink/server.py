"""The Varlink server every syntrop daemon runs.

asyncvarlink gives us the interface model (typed methods, conversion,
declared errors, introspection); this module and syntrop.varlink.connection
own the sockets. They replace asyncvarlink's transport on the server side
for three reasons measured in bench/bench_bus.py and explained in
docs/ARCHITECTURE.md:

- limits: asyncvarlink buffers a message without bound, has no connection or
  per-UID cap, and calls listen(1) on the socket systemd passed us;
- peer credentials: every call runs with its connection's SO_PEERCRED in a
  context variable (syntrop.varlink.peer);
- speed: one recvmsg and one sendmsg per call, the method run in the same
  loop iteration, instead of a peek, a read, two scheduled callbacks and an
  epoll_ctl pair per reply.

Here: the server (listeners, accepting, connection and per-uid input caps,
idle exit) and the sockets a daemon serves on. One connection's reading,
dispatch and writing are syntrop.varlink.connection's.
"""

import asyncio
import collections
import errno
import logging
import os
import resource
import socket
from collections.abc import Callable, Sequence
from typing import Any

from asyncvarlink import (
    VarlinkInterface,
    VarlinkInterfaceRegistry,
    VarlinkMethodCall,
    VarlinkMethodSignature,
)

from syntrop.varlink.connection import Connection
from syntrop.varlink.limits import Limits
from syntrop.varlink.peer import credentials

__all__ = ["Limits", "Server", "bind_unix", "raise_fd_limit"]

logger = logging.getLogger(__name__)


class Server:
    """Serves a set of interfaces on listening and connected sockets."""

    def __init__(
        self,
        interfaces: Sequence[VarlinkInterface],
        *,
        limits: Limits | None = None,
        product: str = "syntrop",
        version: str | None = None,
        keep_alive: Callable[[], bool] | None = None,
    ) -> None:
        from syntrop import __version__
        from syntrop.varlink.service import ServiceInterface

        self.loop = asyncio.get_running_loop()
        self.limits = limits or Limits()
        self.registry = VarlinkInterfaceRegistry()
        self.registry.register_interface(
            ServiceInterface(
                vendor="syntrop",
                product=product,
                version=version or __version__,
                url="",
                registry=self.registry,
            )
        )
        for interface in interfaces:
            self.registry.register_interface(interface)
        #: method string -> (callable, signature), filled by lookup_method for
        #: plain (non-"more") methods; the fast path of _dispatch reads it.
        self.methods: dict[str, tuple[Callable[..., Any], VarlinkMethodSignature]] = {}
        self.connections: set[Connection] = set()
        self.per_uid: collections.Counter[int] = collections.Counter()
        self.buffered_per_uid: collections.Counter[int] = collections.Counter()
        self.buffered = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.listeners: list[socket.socket] = []
        self.stopped = asyncio.Event()
        self.keep_alive = keep_alive
        self._idle_handle: asyncio.TimerHandle | None = None

    def lookup_method(
        self, call: VarlinkMethodCall
    ) -> tuple[Callable[..., Any], VarlinkMethodSignature]:
        """The registry's lookup (raising its Varlink errors), remembered for
        methods a plain call may reach without "more"."""
        method, signature = self.registry.lookup_method(call)
        if not signature.more and len(self.methods) < 4096:
            self.methods[call.method] = (method, signature)
        return method, signature

    # sockets ---------------------------------------------------------------

    def add_listener(self, sock: socket.socket) -> None:
        """Serve a listening socket. Never calls listen(): systemd chose the
        backlog of an inherited socket, and bind_unix() sets ours."""
        sock.setblocking(False)
        self.listeners.append(sock)
        self.loop.add_reader(sock.fileno(), self._on_acceptable, sock)
        self.check_idle()

    def add_connection(self, sock: socket.socket) -> Connection | None:
        """Serve an already connected socket (Accept=yes, `varlinkctl exec:`)."""
        return self._adopt(sock)

    def _on_acceptable(self, listener: socket.socket) -> None:
        for _ in range(64):
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: stop accepting for a moment instead
                    # of spinning on a readable socket we cannot drain.
                    logger.warning("accept failed: %s, pausing for 100 ms", error)
                    self.loop.remove_reader(listener.fileno())
                    self.loop.call_later(0.1, self._resume_accept, listener)
                    return
                logger.warning("accept failed: %s, ignoring", error)
                return
            self._adopt(conn)

    def _resume_accept(self, listener: socket.socket) -> None:
        if listener in self.listeners:
            self.loop.add_reader(listener.fileno(), self._on_acceptable, listener)

    def _adopt(self, sock: socket.socket) -> Connection | None:
        peer = credentials(sock)
        if len(self.connections) >= self.limits.max_connections:
            logger.warning("connection limit %d reached, refusing pid %d",
                           self.limits.max_connections, peer.pid)
            sock.close()
            return None
        if self.per_uid[peer.uid] >= self.limits.max_connections_per_uid:
            logger.warning("per-UID connection limit %d reached for uid %d, refusing pid %d",
                           self.limits.max_connections_per_uid, peer.uid, peer.pid)
            sock.close()
            return None
        connection = Connection(self, sock, peer)
        self.connections.add(connection)
        self.per_uid[peer.uid] += 1
        self._cancel_idle()
        return connection

    def account(self, connection: Connection, size: int) -> bool:
        """Record `connection`'s buffered input as `size` bytes; False when
        that puts its uid or the daemon over the limits."""
        grown = size - connection.accounted
        connection.accounted = size
        uid = connection.peer.uid
        self.buffered_per_uid[uid] += grown
        self.buffered += grown
        if self.buffered_per_uid[uid] <= 0:
            del self.buffered_per_uid[uid]
        return grown <= 0 or (
            self.buffered_per_uid.get(uid, 0) <= self.limits.max_buffered_per_uid
            and self.buffered <= self.limits.max_buffered)

    def connection_closed(self, connection: Connection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.per_uid[connection.peer.uid] -= 1
            if self.per_uid[connection.peer.uid] <= 0:
                del self.per_uid[connection.peer.uid]
        if not self.listeners and not self.connections:
            # Connected-socket mode: the one client is gone.
            self.stop()
        self.check_idle()

    # lifetime --------------------------------------------------------------

    def _cancel_idle(self) -> None:
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None

    def check_idle(self) -> None:
        """(Re)arm the idle exit when nothing is connected or running."""
        timeout = self.limits.idle_timeout
        if timeout is None or self.connections or self.tasks:
            self._cancel_idle()
            return
        if self._idle_handle is None:
            self._idle_handle = self.loop.call_later(timeout, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle_handle = None
        if self.connections or self.tasks:
            return
        if self.keep_alive is not None and self.keep_alive():
            self.check_idle()
            return
        logger.info("idle for %.0f s, exiting", self.limits.idle_timeout or 0)
        self.stop()

    def stop(self) -> None:
        self.stopped.set()

    async def close(self) -> None:
        """Stop accepting, close every connection, cancel running calls."""
        self._cancel_idle()
        for listener in self.listeners:
            self.loop.remove_reader(listener.fileno())
            listener.close()
        self.listeners.clear()
        for connection in list(self.connections):
            connection.close()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def bind_unix(path: str | os.PathLike[str], *, backlog: int = socket.SOMAXCONN) -> socket.socket:
    """Bind and listen on a Unix socket path (dev mode, no activation).

    A socket file nobody listens on is stale and replaced; one somebody does
    listen on means the daemon already runs, and we refuse to steal it.
    """
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)
            else:
                raise FileExistsError(errno.EADDRINUSE, f"{path} is served already")
            finally:
                probe.close()
        sock.bind(path)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def raise_fd_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard one, as systemd advises for
    daemons that hold many connections (the soft 1024 is for select())."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:
            logger.debug("cannot raise RLIMIT_NOFILE: %s", error)
