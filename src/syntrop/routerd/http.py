"""HTTP/1.1 ingress (h11 on asyncio streams): TCP and Unix listeners,
body cap, header and body timeouts."""

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

import h11

from syntrop.routerd.api import Response, error, unauthorized
from syntrop.routerd.config import Config, parse_address
from syntrop.routerd.gateway import Gateway
from syntrop.routerd.queues import TRIAGE, USER

logger = logging.getLogger(__name__)

READ_SIZE = 65536
#: Requests with "x-syntrop-traffic: triage" (sentry's) go to the triage queue.
TRAFFIC_HEADER = b"x-syntrop-traffic"
#: Requests another node of the fleet forwards carry it (providers/peer.py):
#: served by this node's own providers, never forwarded again.
FORWARDED_HEADER = b"x-syntrop-forwarded"
MAX_HEADER_BYTES = 16384
REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found",
           405: b"Method Not Allowed", 408: b"Request Timeout", 413: b"Content Too Large",
           502: b"Bad Gateway",
           503: b"Service Unavailable", 504: b"Gateway Timeout"}


def _marks(request: h11.Request) -> tuple[str, bool]:
    """The request's traffic class (triage or user) and whether another
    node of the fleet forwarded it."""
    traffic, forwarded = USER, False
    for name, value in request.headers:
        if name == TRAFFIC_HEADER and value.lower() == b"triage":
            traffic = TRIAGE
        elif name == FORWARDED_HEADER:
            forwarded = True
    return traffic, forwarded


class HTTPServer:
    def __init__(self, gateway: Gateway, config: Config) -> None:
        self.gateway = gateway
        self.config = config
        self.servers: list[asyncio.Server] = []
        self.addresses: list[str] = []
        #: Addresses that could not be listened on, each with why.
        self.failed: list[str] = []
        self.connections = 0
        #: Connections answered 503 for being over max_connections.
        self.refused = 0
        #: Set by every connection; cleared by RouterService.keep_alive.
        self.active = False

    async def adopt(self, sockets: list[socket.socket]) -> None:
        """Serve listening sockets passed by systemd (routerd.socket)."""
        for sock in sockets:
            sock.setblocking(False)
            if sock.family == socket.AF_UNIX:
                server = await asyncio.start_unix_server(self._serve, sock=sock)
                self.addresses.append(f"unix:{sock.getsockname()}")
            else:
                server = await asyncio.start_server(self._serve, sock=sock)
                host, port = sock.getsockname()[:2]
                self.addresses.append(f"[{host}]:{port}" if sock.family == socket.AF_INET6
                                      else f"{host}:{port}")
            self.servers.append(server)

    async def start(self, addresses: tuple[str, ...], tls: object = None) -> None:
        """Bind `addresses` (`tls`: an SSL context, for peers' HTTPS)."""
        scheme = "https://" if tls is not None else ""
        for text in addresses:
            where = parse_address(text)
            try:
                if isinstance(where, str):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(where)
                    server = await asyncio.start_unix_server(self._serve, path=where)
                    self.addresses.append(f"unix:{where}")
                else:
                    secure: dict[str, Any] = {} if tls is None else {
                        "ssl": tls, "ssl_handshake_timeout": self.config.header_timeout or None}
                    server = await asyncio.start_server(
                        self._serve, where[0], where[1], reuse_address=True, **secure)
                    for sock in server.sockets:
                        host, port = sock.getsockname()[:2]
                        self.addresses.append(scheme + (
                            f"[{host}]:{port}" if sock.family == socket.AF_INET6
                            else f"{host}:{port}"))
            except OSError as failure:
                logger.warning("cannot listen on %s: %s", text, failure.strerror or failure)
                self.failed.append(f"{text}: {failure.strerror or failure}")
                continue
            self.servers.append(server)

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)
        self.servers = []

    async def _next(self, conn: h11.Connection, reader: asyncio.StreamReader) -> object:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await reader.read(READ_SIZE)
            conn.receive_data(data)

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader
                            ) -> tuple[h11.Request, bytes] | Response | None:
        event: object = conn.next_event()  # pipelined: already here
        if event is h11.NEED_DATA:
            async with asyncio.timeout(self.config.header_timeout or None):
                event = await self._next(conn, reader)
        request = event
        if not isinstance(request, h11.Request):
            return None
        cap = self.config.max_body_bytes
        for name, value in request.headers:
            if name == b"content-length" and int(value) > cap:
                return error(413, f"the request body is over {cap} bytes", "request_too_large")
        parts: list[bytes] = []
        size = 0
        event = conn.next_event()
        if isinstance(event, h11.EndOfMessage):  # a body-less request, all here
            return request, b""
        if isinstance(event, h11.Data) and len(event.data) <= cap:
            parts.append(bytes(event.data))
            size = len(event.data)
            event = conn.next_event()
            if isinstance(event, h11.EndOfMessage):  # the usual case: one read held it all
                return request, parts[0]
        if event is not h11.NEED_DATA and not isinstance(event, h11.Data | h11.EndOfMessage):
            return None
        async with asyncio.timeout(self.config.body_timeout or None):
            while True:
                if event is h11.NEED_DATA:
                    event = await self._next(conn, reader)
                if isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > cap:
                        return error(413, f"the request body is over {cap} bytes",
                                     "request_too_large")
                    parts.append(bytes(event.data))
                    event = conn.next_event()
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return None
        return request, b"".join(parts)

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter,
                    response: Response, close: bool) -> None:
        headers = [(b"content-type", response.content_type.encode()),
                   (b"server", b"routerd"), *response.headers]
        if close:
            headers.append((b"connection", b"close"))
        if response.stream is None:
            headers.append((b"content-length", str(len(response.body)).encode()))
        else:
            headers.append((b"cache-control", b"no-cache"))
        # One write per response, or per chunk (the head goes with the first).
        out = conn.send(h11.Response(status_code=response.status, headers=headers,
                                     reason=REASONS.get(response.status, b""))) or b""
        if response.stream is None:
            writer.write(out + (conn.send(h11.Data(data=response.body)) or b"")
                         + (conn.send(h11.EndOfMessage()) or b""))
            await writer.drain()
            return
        stream = response.stream
        try:
            async for chunk in stream:
                writer.write(out + (conn.send(h11.Data(data=chunk)) or b""))
                out = b""
                await writer.drain()
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        writer.write(out + (conn.send(h11.EndOfMessage()) or b""))
        await writer.drain()

    async def _refuse(self, conn: h11.Connection, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """Over `max_connections`: read the request head (closing unread
        input would reset the connection before the client sees why), answer
        503 and close. The body, if any, is not read."""
        self.refused += 1
        with contextlib.suppress(TimeoutError, h11.RemoteProtocolError):
            async with asyncio.timeout(self.config.header_timeout or None):
                event = await self._next(conn, reader)
            if isinstance(event, h11.Request):
                await self._send(conn, writer, error(
                    503, f"over {self.config.max_connections} connections at once; retry",
                    "server_overloaded"), True)

    def _authorized(self, request: h11.Request, writer: asyncio.StreamWriter) -> bool:
        """Whether a request may pass when API keys are configured: it bears
        one (Authorization: Bearer KEY, compared in constant time), asks for
        /health only, or came over mutual TLS (a LAN peer's certificate
        already said who it is)."""
        if request.target.partition(b"?")[0] == b"/health" or \
                writer.get_extra_info("ssl_object") is not None:
            return True
        import hmac  # here: it maps libcrypto, ~4 MiB of the budget, for keys only
        for name, value in request.headers:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return False
                presented = token.strip()
                # Every key compared, so the time says nothing of which matched.
                return sum(hmac.compare_digest(presented, key.encode())
                           for key in self.config.api_keys) > 0
        return False

    async def _next_request(self, conn: h11.Connection, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> tuple[h11.Request, bytes] | None:
        """The next request and its body; None when the connection ends
        (the client left, or was answered why and is closed)."""
        try:
            got = await self._read_request(conn, reader)
        except TimeoutError:
            if conn.our_state is h11.SEND_RESPONSE or conn.their_state is h11.SEND_BODY:
                await self._send(conn, writer, error(408, "request too slow"), True)
            return None
        except h11.RemoteProtocolError as bad:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self._send(conn, writer, error(400, f"malformed HTTP: {bad}"), True)
            return None
        except ValueError:
            await self._send(conn, writer, error(400, "malformed HTTP"), True)
            return None
        if isinstance(got, Response):
            await self._send(conn, writer, got, True)
            return None
        return got

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.active = True
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        try:
            if self.connections > self.config.max_connections:
                await self._refuse(conn, reader, writer)
                return
            while True:
                got = await self._next_request(conn, reader, writer)
                if got is None:
                    break
                request, body = got
                traffic, forwarded = _marks(request)
                if self.config.api_keys and not self._authorized(request, writer):
                    await self._send(conn, writer, unauthorized(), False)
                    conn.start_next_cycle()
                    continue
                try:
                    response = await self.gateway.handle(
                        request.method.decode(), request.target.decode("latin-1"), body,
                        traffic, forwarded)
                except Exception:  # never let a request take the daemon down
                    logger.exception("request failed")
                    response = error(502, "internal error")
                try:
                    await self._send(conn, writer, response, False)
                finally:
                    if response.closer is not None:  # a stream never started too
                        await response.closer()
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    break
                conn.start_next_cycle()
        except (OSError, h11.LocalProtocolError, h11.RemoteProtocolError):
            pass
        except asyncio.CancelledError:
            # Shutting down: end quietly (a cancelled connection task makes
            # asyncio's stream callback log a traceback).
            pass
        finally:
            self.connections -= 1
            writer.close()
