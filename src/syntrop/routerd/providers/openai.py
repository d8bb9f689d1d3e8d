"""An OpenAI-compatible HTTP upstream (vLLM, llama-server, ollama, remote
APIs) through a small h11 client on asyncio streams: keep-alive connections
reused (up to the provider's `idle_connections` kept idle), server-sent events relayed chunk by
chunk."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import h11

from syntrop.routerd.config import ProviderConfig
from syntrop.routerd.providers.base import ProviderError
from syntrop.routerd.sse import SSEParser

#: The most of an upstream's non-streamed answer routerd holds.
MAX_RESPONSE_BYTES = 16 << 20
READ_SIZE = 65536
_Pair = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Exchange:
    """One request and its response on a fresh connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: float, idle: list[_Pair], max_idle: int) -> None:
        self.reader, self.writer, self.timeout = reader, writer, timeout
        self.conn = h11.Connection(h11.CLIENT)
        self.status = 0
        self.idle, self.max_idle = idle, max_idle

    async def event(self) -> Any:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as error:
                raise ProviderError(502, f"upstream sent a malformed response: {error}") from None
            if event is not h11.NEED_DATA:
                return event
            try:
                # asyncio.timeout, not wait_for: no task per read.
                async with asyncio.timeout(self.timeout):
                    data = await self.reader.read(READ_SIZE)
            except TimeoutError:
                raise ProviderError(504, "upstream did not answer in time") from None
            except OSError as error:
                raise ProviderError(502, f"upstream connection failed: {error}") from None
            self.conn.receive_data(data)

    async def body(self) -> AsyncIterator[bytes]:
        while True:
            event = await self.event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise ProviderError(502, "upstream closed the connection mid-response")

    async def read_all(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        async for part in self.body():
            size += len(part)
            if size > MAX_RESPONSE_BYTES:
                raise ProviderError(502, "upstream response too large")
            parts.append(part)
        return b"".join(parts)

    def close(self) -> None:
        """Back to the idle pool when the exchange ended cleanly and both
        sides keep the connection; closed otherwise."""
        if (self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE
                and len(self.idle) < self.max_idle and not self.writer.is_closing()):
            self.idle.append((self.reader, self.writer))
        else:
            self.writer.close()


class OpenAIProvider:
    #: Headers sent with every request, besides the standard ones.
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        url = urlsplit(config.endpoint)
        self.tls = url.scheme == "https"
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or (443 if self.tls else 80)
        self.base = url.path.rstrip("/") or "/v1"
        self.authority = url.netloc.encode()
        self.idle: list[_Pair] = []
        self._tls_context: Any = None

    def _context(self) -> Any:
        """The TLS context of an https endpoint (made once); None for http."""
        if not self.tls:
            return None
        if self._tls_context is None:
            from syntrop.routerd.tls import client_context

            config = self.config
            self._tls_context = client_context(config.tls_ca, config.tls_cert, config.tls_key)
        return self._tls_context

    async def _open(self, method: str, path: str, body: bytes | None,
                    root: bool = False) -> _Exchange:
        while self.idle:
            reader, writer = self.idle.pop()
            if writer.is_closing() or reader.at_eof():
                writer.close()
                continue
            try:
                exchange = _Exchange(reader, writer, self.config.timeout, self.idle,
                                     self.config.idle_connections)
                return await self._send(exchange, method, path, body, root)
            except ProviderError as failure:
                if failure.status == 504:
                    raise
                # The upstream closed the idle connection: a fresh one.
        timeout = self.config.timeout
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self._context()),
                timeout)
        except TimeoutError:
            raise ProviderError(504, "upstream did not accept a connection in time") from None
        except OSError as error:
            raise ProviderError(502, f"upstream unreachable: {error.strerror or error}") from None
        return await self._send(_Exchange(reader, writer, timeout, self.idle,
                                          self.config.idle_connections),
                                method, path, body, root)

    async def _send(self, exchange: _Exchange, method: str, path: str,
                    body: bytes | None, root: bool = False) -> _Exchange:
        """Send a request for `path` under the endpoint's base (under the
        server's root with `root`)."""
        writer = exchange.writer
        headers = [(b"host", self.authority), (b"user-agent", b"syntrop-routerd"),
                   (b"accept", b"application/json, text/event-stream"), *self.headers]
        if self.config.api_key:
            headers.append((b"authorization", b"Bearer " + self.config.api_key.encode()))
        if body is not None:
            headers += [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]
        conn = exchange.conn
        target = path if root else self.base + path
        out = conn.send(h11.Request(method=method, target=target.encode(),
                                    headers=headers)) or b""
        if body:
            out += conn.send(h11.Data(data=body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        try:
            writer.write(out)
            await writer.drain()
            while True:
                event = await exchange.event()
                if isinstance(event, h11.Response):
                    exchange.status = event.status_code
                    return exchange
                if isinstance(event, h11.ConnectionClosed):
                    raise ProviderError(502, "upstream closed the connection without answering")
        except OSError as error:
            writer.close()
            raise ProviderError(502, f"upstream connection failed: {error}") from None
        except BaseException:
            exchange.writer.close()
            raise

    async def _failed(self, exchange: _Exchange) -> ProviderError:
        text = (await exchange.read_all())[:4096].decode("utf-8", "replace")
        message = text
        try:
            decoded = json.loads(text)
            message = decoded["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        if exchange.status >= 500 or exchange.status in (401, 403, 408, 429):
            return ProviderError(502, f"upstream answered {exchange.status}: {message}")
        return ProviderError(exchange.status, str(message), retryable=False)

    async def complete(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any] | bytes:
        """The answer as the upstream sent it (checked, not re-encoded)."""
        payload = json.dumps(body if endpoint == "embeddings"
                             else {**body, "stream": False}).encode()
        exchange = await self._open("POST", "/" + endpoint, payload)
        try:
            if exchange.status != 200:
                raise await self._failed(exchange)
            raw = await exchange.read_all()
        finally:
            exchange.close()
        try:
            answer = json.loads(raw)
        except ValueError:
            raise ProviderError(502, "upstream answered something that is not JSON") from None
        field = "data" if endpoint == "embeddings" else "choices"
        if not isinstance(answer, dict) or not isinstance(answer.get(field), list):
            raise ProviderError(502, f"upstream answered JSON without {field}")
        return raw

    async def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[str]:
        payload = json.dumps({**body, "stream": True}).encode()
        exchange = await self._open("POST", "/" + endpoint, payload)
        try:
            if exchange.status != 200:
                raise await self._failed(exchange)
            parser = SSEParser()
            async for part in exchange.body():
                try:
                    events = parser.feed(part)
                except ValueError as error:
                    raise ProviderError(502, str(error)) from None
                for data in events:
                    if data.strip() == "[DONE]":
                        async for _ in exchange.body():  # to its end: reusable
                            pass
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise ProviderError(502, "upstream sent non-JSON data") from None
                    if not isinstance(chunk, dict):
                        raise ProviderError(502, "upstream sent an event that is not an object")
                    if "error" in chunk:
                        raise ProviderError(502, f"upstream failed: {chunk['error']}")
                    yield data
            raise ProviderError(502, "upstream ended the stream without [DONE]")
        finally:
            exchange.close()

    async def list_models(self) -> list[str]:
        exchange = await self._open("GET", "/models", None)
        try:
            if exchange.status != 200:
                raise await self._failed(exchange)
            raw = await exchange.read_all()
        finally:
            exchange.close()
        try:
            return [str(entry["id"]) for entry in json.loads(raw)["data"]]
        except (ValueError, KeyError, TypeError):
            raise ProviderError(502, "upstream's model list is malformed") from None
