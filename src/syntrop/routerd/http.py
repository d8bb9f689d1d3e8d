"""HTTP/1.1 ingress (wire.py's framing on asyncio streams): TCP and Unix
listeners, keep-alive and pipelining, body cap, header and body timeouts."""

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from syntrop.config import ConfigError
from syntrop.routerd.api import Response, error, unauthorized, unsupported_media
from syntrop.routerd.config import Config, open_without_keys, parse_address
from syntrop.routerd.gateway import Gateway
from syntrop.routerd.queues import TRIAGE, USER
from syntrop.routerd.wire import (
    CONTINUE,
    LAST_CHUNK,
    BadMessage,
    Request,
    RequestReader,
    chunk,
    response_head,
)

logger = logging.getLogger(__name__)

READ_SIZE = 65536
#: Requests with "x-syntrop-traffic: triage" (sentry's) go to the triage
#: queue: over the Unix socket only, for any TCP client could send it.
TRAFFIC_HEADER = b"x-syntrop-traffic"
#: Requests another node of the fleet forwards carry it (providers/peer.py):
#: served by this node's own providers, never forwarded again. Honoured
#: only from a member: over mutual TLS (tls_listen), from a certificate
#: tls_client_ca signed; from anyone else it is ignored (`_marks`).
FORWARDED_HEADER = b"x-syntrop-forwarded"
#: Seconds one send of a response may wait on a client that does not read
#: (http.body_timeout where set): then it is cut off, and what its answer
#: held (an admission place, a prefill's state) given back.
SEND_TIMEOUT = 30.0
MAX_HEADER_BYTES = 16384
#: Host values any TCP request may bear (with any port, or none).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})


def _marks(request: Request, unix: bool, member: bool) -> tuple[str, bool]:
    """The request's traffic class (triage or user) and whether another
    node of the fleet forwarded it. Triage only over the Unix socket
    (sentry's path), forwarded only from a `member` (`_member`): elsewhere
    each header is ignored, the request is a client's."""
    traffic, forwarded = USER, False
    for name, value in request.headers:
        if name == TRAFFIC_HEADER and unix and value.lower() == b"triage":
            traffic = TRIAGE
        elif name == FORWARDED_HEADER and member:
            forwarded = True
    return traffic, forwarded


def _member(writer: asyncio.StreamWriter) -> bool:
    """Whether the connection is a fleet member's: it came over mutual TLS
    (tls_listen demands a certificate tls_client_ca signed) and its
    certificate was verified. Plain TCP and the Unix socket are clients."""
    tls = writer.get_extra_info("ssl_object")
    return tls is not None and bool(tls.getpeercert())


def address(sockname: Any, family: int) -> str:
    """A TCP socket's address as 'host:port' or '[v6]:port'."""
    host, port = sockname[:2]
    return f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"


def host_allowed(value: bytes | None, local: frozenset[str],
                 allowed: tuple[str, ...]) -> bool:
    """Whether a TCP request's Host names this routerd: one of `local`
    (the listen addresses as bound, and the connection's own), localhost,
    127.0.0.1 or [::1] at any port, or an `allowed` name ("name": any
    port; "name:port": that one). A page that rebinds its own name to
    loopback sends that name, and is refused."""
    if value is None:
        return False
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        name, bracket, port = text.partition("]")
        name += bracket
        if port and not port.startswith(":"):
            return False
        port = port[1:]
    else:
        name, _, port = text.partition(":")
    if not name or (port and not port.isdigit()):
        return False
    return name in LOOPBACK_HOSTS or name in allowed or text in allowed or text in local


def misdirected() -> Response:
    """421 in OpenAI's words, for a Host that is not this routerd's."""
    return error(421, "the Host header names no address of this routerd: use its listen "
                 "address or localhost, or add the name to http.allowed_hosts",
                 "misdirected_request")


def unsupported_body(content_type: bytes | None) -> Response | None:
    """415 for a POST whose body is not declared JSON; none declared is
    refused too (a browser posts one across sites without asking)."""
    if content_type is None:
        return error(415, "the request body must be JSON: send Content-Type: "
                     "application/json", "unsupported_media_type")
    return unsupported_media(content_type)


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
        """Serve listening sockets passed by systemd (routerd.socket): a
        TCP one beyond loopback only with API keys (ConfigError)."""
        if not self.config.api_keys:
            beyond = open_without_keys([address(s.getsockname(), s.family) for s in sockets
                                        if s.family != socket.AF_UNIX])
            if beyond:
                raise ConfigError(f"routerd.socket listens on {', '.join(beyond)}, beyond "
                                  "loopback: set http.api_keys_file or "
                                  "http.api_keys_credential in routerd.toml (or listen "
                                  "on loopback only)")
        for sock in sockets:
            sock.setblocking(False)
            if sock.family == socket.AF_UNIX:
                server = await asyncio.start_unix_server(self._serve, sock=sock)
                self.addresses.append(f"unix:{sock.getsockname()}")
            else:
                server = await asyncio.start_server(self._serve, sock=sock)
                self.addresses.append(address(sock.getsockname(), sock.family))
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
                        self.addresses.append(scheme + address(sock.getsockname(),
                                                               sock.family))
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

    async def _read(self, reader: asyncio.StreamReader, parser: RequestReader,
                    writer: asyncio.StreamWriter, whole: bool) -> bool:
        """Read until the parser holds a whole request (`whole`) or the
        current one's head; False when the client left first."""
        while not (parser.ready or parser.closed or (parser.head_done and not whole)):
            if whole and parser.expects_continue:
                parser.expects_continue = False
                writer.write(CONTINUE)
            data = await reader.read(READ_SIZE)
            if not data:
                return False
            parser.feed(data)
        return True

    async def _read_request(self, parser: RequestReader, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> Request | None:
        """The next request, once it is all here (it usually is at once:
        pipelined, or one read held it); None when the client left."""
        if not parser.ready and not parser.closed:
            config = self.config
            if not parser.head_done:
                async with asyncio.timeout(config.header_timeout or None):
                    if not await self._read(reader, parser, writer, False):
                        return None
            if not parser.ready and not parser.closed:
                async with asyncio.timeout(config.body_timeout or None):
                    if not await self._read(reader, parser, writer, True):
                        return None
        if parser.ready:
            return parser.ready.pop(0)
        failure = parser.failure()
        if failure is not None:
            raise failure
        return None  # upgraded, and every request it held served

    def _cors(self, request: Request) -> list[tuple[bytes, bytes]]:
        """The CORS headers for a request from an allowed origin (http.
        cors_origins); none for one without an Origin or from another."""
        origin = request.header(b"origin")
        allowed = self.config.cors_origins
        if origin is None or not allowed or \
                ("*" not in allowed and origin.decode("latin-1") not in allowed):
            return []
        return [(b"access-control-allow-origin", origin), (b"vary", b"origin")]

    def _preflight(self, request: Request, cors: list[tuple[bytes, bytes]]) -> Response:
        """A browser's OPTIONS before its real request: allowed, 204 with
        what may follow; from an origin not allowed, 403 saying so."""
        if not cors:
            return error(403, "this origin may not call routerd (http.cors_origins)",
                         "origin_not_allowed")
        asked = request.header(b"access-control-request-headers")
        return Response(status=204, body=b"", headers=(
            (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
            (b"access-control-allow-headers", asked or b"authorization, content-type"),
            (b"access-control-max-age", b"600")))

    async def _send(self, writer: asyncio.StreamWriter, response: Response, close: bool,
                    request: Request | None = None,
                    extra: list[tuple[bytes, bytes]] | None = None) -> None:
        """Write `response` (with `extra` headers): one write, or one per
        chunk of a stream (the head goes with the first). A stream is
        chunked, except to an HTTP/1.0 client: its end is the connection's."""
        http_1_0 = request is not None and request.http_1_0
        headers = [(b"content-type", response.content_type.encode()),
                   (b"server", b"routerd"), *response.headers, *(extra or ())]
        if close:
            headers.append((b"connection", b"close"))
        if response.stream is None:
            headers.append((b"content-length", b"%d" % len(response.body)))
        else:
            headers.append((b"cache-control", b"no-cache"))
            if not http_1_0:
                headers.append((b"transfer-encoding", b"chunked"))
        out = response_head(response.status, headers)
        if response.stream is None:
            writer.write(out if request is not None and request.method == b"HEAD"
                         else out + response.body)
            await self._drain(writer)
            return
        stream = response.stream
        try:
            async for part in stream:
                writer.write(out + (part if http_1_0 else chunk(part)))
                out = b""
                await self._drain(writer)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        writer.write(out + (b"" if http_1_0 else LAST_CHUNK))
        await self._drain(writer)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait until what was written is sent (most of it: asyncio's
        buffer), at most SEND_TIMEOUT (http.body_timeout where set); a
        client that stops reading is then cut off: its connection aborted,
        the unsent bytes dropped (TimeoutError)."""
        try:
            async with asyncio.timeout(self.config.body_timeout or SEND_TIMEOUT):
                await writer.drain()
        except TimeoutError:
            writer.transport.abort()
            raise

    async def _refuse(self, parser: RequestReader, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """Over `max_connections`: read the request head (closing unread
        input would reset the connection before the client sees why), answer
        503 and close. The body, if any, is not read."""
        self.refused += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.header_timeout or None):
                if not await self._read(reader, parser, writer, False) or parser.closed:
                    return
            await self._send(writer, error(
                503, f"over {self.config.max_connections} connections at once; retry",
                "server_overloaded"), True)

    def _caller(self, request: Request, writer: asyncio.StreamWriter) -> str | None:
        """Who a request is when API keys are configured: the key it bears
        (Authorization: Bearer KEY, or X-Api-Key: KEY as Anthropic's clients
        send it; compared in constant time), named by a digest of it
        (stored responses are that caller's); "" for /health only, or for
        a LAN peer over mutual TLS (its certificate already said who it
        is); None when it may not pass."""
        if request.target.partition(b"?")[0] == b"/health" or \
                writer.get_extra_info("ssl_object") is not None:
            return ""
        import hmac  # here: it maps libcrypto, ~4 MiB of the budget, for keys only
        for name, value in request.headers:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    continue  # another scheme (a proxy's Basic): an X-Api-Key may follow
                presented = token.strip()
            elif name == b"x-api-key":  # how Anthropic's clients send theirs
                presented = value.strip()
            else:
                continue
            # Every key compared, so the time says nothing of which matched.
            if sum(hmac.compare_digest(presented, key.encode())
                   for key in self.config.api_keys) == 0:
                return None
            from syntrop.system.digest import sha256

            return "key:" + str(sha256(presented).hexdigest())[:16]
        return None

    def _local(self, writer: asyncio.StreamWriter) -> frozenset[str] | None:
        """The Host values a TCP connection's requests may bear besides
        the loopback and configured names: the listen addresses and the
        connection's own; None over mutual TLS (a peer's certificate, not
        its Host, says who it is)."""
        if writer.get_extra_info("ssl_object") is not None:
            return None
        sock = writer.get_extra_info("socket")
        own = {address(sock.getsockname(), sock.family)} if sock is not None else set()
        return frozenset(a.removeprefix("https://").lower() for a in (*self.addresses, *own))

    def _admit(self, request: Request, writer: asyncio.StreamWriter,
               local: frozenset[str] | None, cors: list[tuple[bytes, bytes]]) -> Response | str:
        """Who the request is (its caller, as _caller says), or the answer
        it gets before the gateway sees it: 421 for a Host not this
        routerd's (`local` None: the Unix socket or mutual TLS, unchecked;
        an HTTP/1.0 request may have none), a preflight's, 401 without a
        key, 415 for a POST body not declared JSON (undeclared passes only
        where `local` is None: no browser is there)."""
        host = request.header(b"host")
        if local is not None and not (host is None and request.http_1_0) and \
                not host_allowed(host, local, self.config.allowed_hosts):
            return misdirected()
        if request.method == b"OPTIONS" and \
                request.header(b"access-control-request-method") is not None:
            # Before the keys: a browser's preflight carries none.
            return self._preflight(request, cors)
        caller = self._caller(request, writer) if self.config.api_keys else ""
        if caller is None:
            return unauthorized()
        if request.method == b"POST":
            content_type = request.header(b"content-type")
            refused = unsupported_media(content_type) if local is None \
                else unsupported_body(content_type)
            if refused is not None:
                return refused
        return caller

    async def _next_request(self, parser: RequestReader, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> Request | None:
        """The next request; None when the connection ends (the client
        left, or was answered why and is closed)."""
        try:
            return await self._read_request(parser, reader, writer)
        except TimeoutError:
            if parser.head_done:  # a head without its body: say why
                await self._send(writer, error(408, "request too slow"), True)
            return None
        except BadMessage as bad:
            code = {413: "request_too_large", 431: "request_too_large"}.get(bad.status)
            await self._send(writer, error(bad.status, str(bad), code), True)
            return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.active = True
        parser = RequestReader(MAX_HEADER_BYTES, self.config.max_body_bytes)
        sock = writer.get_extra_info("socket")
        unix = sock is not None and sock.family == socket.AF_UNIX
        local = None if unix else self._local(writer)
        member = _member(writer)
        try:
            if self.connections > self.config.max_connections:
                await self._refuse(parser, reader, writer)
                return
            while True:
                request = await self._next_request(parser, reader, writer)
                if request is None:
                    break
                # HTTP/1.0 is answered once: its keep-alive is not worth having.
                close = not request.keep_alive or parser.closed or request.http_1_0
                traffic, forwarded = _marks(request, unix, member)
                cors = self._cors(request)
                caller = self._admit(request, writer, local, cors)
                if isinstance(caller, Response):
                    await self._send(writer, caller, close, request, cors)
                    if close:
                        break
                    continue
                try:
                    response = await self.gateway.handle(
                        request.method.decode("latin-1"), request.target.decode("latin-1"),
                        request.body, traffic, forwarded, caller)
                except Exception:  # never let a request take the daemon down
                    logger.exception("request failed")
                    response = error(502, "internal error")
                try:
                    await self._send(writer, response, close, request, cors)
                finally:
                    if response.closer is not None:  # a stream never started too
                        await response.closer()
                if close:
                    break
        except (OSError, ValueError):
            pass
        except asyncio.CancelledError:
            # Shutting down: end quietly (a cancelled connection task makes
            # asyncio's stream callback log a traceback).
            pass
        finally:
            self.connections -= 1
            parser.close()
            writer.close()
