"""A small etcd v3 client over etcd's JSON gateway (/v3/...): what the
fleet needs (leases, put, a prefix's range, watch), on routerd's own HTTP
client, so routerd carries no gRPC stack.

Keys and values travel base64-encoded, 64-bit integers as strings (the
gateway's protobuf JSON). Requests go to the endpoint that answered last and
fail over to the others in order, each try bounded by the per-request
`timeout`, whether the member refuses, hangs, answers an error or drops
the connection mid-answer: one dead member of a cluster changes nothing.
Every failure is EtcdError.
"""

import base64
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from syntrop.routerd.config import ProviderConfig
from syntrop.routerd.providers import ProviderError

#: Bytes of one watch message routerd holds at most.
MAX_MESSAGE = 1 << 20


class EtcdError(Exception):
    """No endpoint answered, or one answered with an error."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _text(value: str) -> str:
    return base64.b64decode(value).decode()


def prefix_end(prefix: str) -> str:
    """The range_end that makes [prefix, end) every key under `prefix`."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # "PUT" or "DELETE"
    key: str
    value: str
    revision: int


class Etcd:
    def __init__(self, endpoints: tuple[str, ...], *, timeout: float = 3.0, tls_ca: str = "",
                 tls_cert: str = "", tls_key: str = "") -> None:
        from syntrop.routerd.providers.openai import OpenAIProvider

        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.clients = [OpenAIProvider(ProviderConfig(
            id=f"etcd{index}", kind="openai", endpoint=url, timeout=timeout,
            tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key))
            for index, url in enumerate(endpoints)]
        self._good = 0
        #: When an endpoint last answered (monotonic seconds).
        self.answered_at = float("-inf")

    def close(self) -> None:
        """Let go of every endpoint's connections."""
        for client in self.clients:
            for _, writer in client.idle:
                writer.close()
            client.idle.clear()

    def _next(self) -> None:
        """The endpoint that answered last failed: start with the next."""
        self._good = (self._good + 1) % len(self.clients)

    async def _open(self, path: str, body: dict[str, Any]) -> Any:
        """An exchange with status 200 from the first endpoint that gives one."""
        payload = json.dumps(body).encode()
        failures = []
        for step in range(len(self.clients)):
            index = (self._good + step) % len(self.clients)
            client = self.clients[index]
            try:
                exchange = await client._open("POST", path, payload, root=True)
            except ProviderError as failure:
                failures.append(f"{client.config.endpoint}: {failure.message}")
                continue
            if exchange.status == 200:
                self._good, self.answered_at = index, time.monotonic()
                return exchange
            try:
                text = (await exchange.read_all())[:300].decode("utf-8", "replace")
            except ProviderError:
                text = ""
            finally:
                exchange.close()
            failures.append(f"{client.config.endpoint}: {exchange.status} {text}")
        raise EtcdError("; ".join(failures))

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A unary request's answer; an endpoint that fails mid-answer is
        left for the next (every request routerd makes may be repeated)."""
        failures = []
        for _ in self.clients:
            exchange = await self._open(path, body)
            try:
                raw = await exchange.read_all()
            except ProviderError as failure:
                failures.append(failure.message)
                self._next()
                continue
            finally:
                exchange.close()
            return _object(path, raw)
        raise EtcdError("; ".join(failures))

    async def grant(self, ttl: int) -> int:
        answer = await self._call("/v3/lease/grant", {"TTL": ttl})
        try:
            return int(answer["ID"])
        except (KeyError, ValueError):
            raise EtcdError(f"lease grant answered {answer}") from None

    async def keepalive(self, lease: int) -> int:
        """Renew `lease`; its TTL now, 0 when it has expired."""
        failures = []
        for _ in self.clients:
            exchange = await self._open("/v3/lease/keepalive", {"ID": str(lease)})
            try:
                async with contextlib.aclosing(_lines(exchange)) as lines:
                    async for line in lines:
                        try:
                            return int(json.loads(line)["result"].get("TTL", 0))
                        except (ValueError, KeyError, TypeError, AttributeError):
                            raise EtcdError(f"keepalive answered {line[:200]!r}") from None
                failures.append("keepalive ended without an answer")
            except EtcdError as failure:  # the connection failed mid-answer
                failures.append(str(failure))
            finally:
                exchange.writer.close()  # a stream: not reusable
            self._next()
        raise EtcdError("; ".join(failures))

    async def revoke(self, lease: int) -> None:
        await self._call("/v3/lease/revoke", {"ID": str(lease)})

    async def put(self, key: str, value: str, lease: int | None = None) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease is not None:
            body["lease"] = str(lease)
        await self._call("/v3/kv/put", body)

    async def range_prefix(self, prefix: str) -> tuple[int, dict[str, str]]:
        """(revision, {key: value}) of every key under `prefix`."""
        answer = await self._call("/v3/kv/range",
                                  {"key": _b64(prefix), "range_end": prefix_end(prefix)})
        revision = int(answer.get("header", {}).get("revision", 0))
        return revision, {_text(kv["key"]): _text(kv.get("value", ""))
                          for kv in answer.get("kvs", [])}

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[Event]:
        """Changes under `prefix` from `start_revision` on, until the
        connection ends (EtcdError)."""
        exchange = await self._open("/v3/watch", {"create_request": {
            "key": _b64(prefix), "range_end": prefix_end(prefix),
            "start_revision": str(start_revision)}})
        # A watch is quiet while nothing changes: no read timeout. A dead
        # connection is noticed by the lease renewals beside it, which then
        # end the session and this watch with it.
        exchange.timeout = None
        try:
            async with contextlib.aclosing(_lines(exchange)) as lines:
                async for line in lines:
                    for event in _events(line):
                        yield event
        finally:
            exchange.writer.close()
        raise EtcdError("the watch ended")


def _object(path: str, raw: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(raw)
    except ValueError:
        raise EtcdError(f"{path}: not JSON") from None
    if not isinstance(answer, dict):
        raise EtcdError(f"{path}: not an object")
    return answer


async def _lines(exchange: Any) -> AsyncGenerator[bytes, None]:
    """The messages of a streamed gateway answer: it ends each with a
    newline. Its transport's failures are EtcdError."""
    buffer = b""
    try:
        async for part in exchange.body():
            buffer += part
            if len(buffer) > MAX_MESSAGE:
                raise EtcdError("a streamed message is too long")
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                yield line
    except ProviderError as failure:
        raise EtcdError(failure.message) from None


def _events(line: bytes) -> list[Event]:
    """The events of one watch message; [] for one without events (the
    creation notice, progress) or that is not JSON."""
    if not line.strip():
        return []
    try:
        message = json.loads(line)
    except ValueError:
        return []
    result = message.get("result") or {}
    if message.get("error"):
        raise EtcdError(f"watch failed: {message['error']}")
    if result.get("canceled"):
        raise EtcdError(f"watch canceled: {result.get('cancel_reason', '')}")
    revision = int(result.get("header", {}).get("revision", 0))
    return [Event(kind=event.get("type", "PUT"), key=_text(event["kv"]["key"]),
                  value=_text(event["kv"].get("value", "")), revision=revision)
            for event in result.get("events", [])]
