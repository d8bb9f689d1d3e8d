"""An OpenAI-compatible HTTP upstream (vLLM, llama-server, ollama, remote
APIs) through a small client on asyncio streams (wire.py's framing):
keep-alive connections reused (up to the provider's `idle_connections` kept
idle), server-sent events relayed chunk by chunk."""

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from syntrop.routerd.config import ProviderConfig
from syntrop.routerd.providers.base import Basics, Handed, ProviderError
from syntrop.routerd.sse import SSEParser
from syntrop.routerd.wire import ResponseReader, request_head

if TYPE_CHECKING:
    from syntrop.routerd.request import Request

#: The most of an upstream's non-streamed answer routerd holds.
MAX_RESPONSE_BYTES = 16 << 20
READ_SIZE = 65536
_Pair = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Exchange:
    """One request and its response on a connection (fresh or kept alive)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: float, idle: list[_Pair], max_idle: int) -> None:
        self.reader, self.writer, self.timeout = reader, writer, timeout
        self.response = ResponseReader()
        self.status = 0
        self.idle, self.max_idle = idle, max_idle

    async def _fill(self) -> None:
        """One read from the upstream into the response."""
        try:
            # asyncio.timeout, not wait_for: no task per read.
            async with asyncio.timeout(self.timeout):
                data = await self.reader.read(READ_SIZE)
        except TimeoutError:
            raise ProviderError(504, "upstream did not answer in time") from None
        except OSError as error:
            raise ProviderError(502, f"upstream connection failed: {error}") from None
        if not data and not self.response.done:
            if not self.response.head_done:
                raise ProviderError(502, "upstream closed the connection without answering")
            if self.response.framed:
                raise ProviderError(502, "upstream closed the connection mid-response")
        try:
            self.response.feed(data)
        except ValueError as error:
            raise ProviderError(502, f"upstream sent a malformed response: {error}") from None

    async def head(self) -> None:
        while not self.response.head_done:
            await self._fill()
        self.status = self.response.status

    async def body(self) -> AsyncIterator[bytes]:
        response = self.response
        while True:
            if response.parts:
                yield response.take()
            if response.done:
                return
            await self._fill()

    async def read_all(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        async for part in self.body():
            size += len(part)
            if size > MAX_RESPONSE_BYTES:
                raise ProviderError(502, "upstream response too large")
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Back to the idle pool when the response was read to its end and
        both sides keep the connection; closed otherwise."""
        if (self.response.done and self.response.reusable
                and len(self.idle) < self.max_idle and not self.writer.is_closing()):
            self.idle.append((self.reader, self.writer))
        else:
            self.writer.close()


class OpenAIProvider(Basics):
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
                        (b"content-length", b"%d" % len(body))]
        target = path if root else self.base + path
        out = request_head(method.encode(), target.encode(), headers)
        if body:
            out += body
        try:
            writer.write(out)
            await writer.drain()
            await exchange.head()
            return exchange
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

    def _sent(self, request: "Request", handed: Handed | None) -> dict[str, Any]:
        """The body sent upstream: the client's, passed through, the model
        the candidate's (a provider that `continues` leaves a continued
        answer's turn open; a peer adds its hand-off)."""
        body = request.sent()
        if request.continuation and self.capabilities.continues:
            body["continue_final_message"] = True
        return body

    async def complete(self, request: "Request",
                       handed: Handed | None = None) -> dict[str, Any] | bytes:
        """The answer as the upstream sent it (checked, not re-encoded)."""
        endpoint, body = request.endpoint, self._sent(request, handed)
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

    async def stream(self, request: "Request",
                     handed: Handed | None = None) -> AsyncGenerator[str, None]:
        payload = json.dumps({**self._sent(request, handed), "stream": True}).encode()
        exchange = await self._open("POST", "/" + request.endpoint, payload)
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
