"""A streamed answer on its way to the client, and its continuation on
another provider when the first fails midway (docs/routerd.md, Failure
behaviour). It needs of the gateway only what `Streams` names."""

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Protocol

from syntrop.routerd import scoring
from syntrop.routerd.providers import ProviderError
from syntrop.routerd.queues import Admission
from syntrop.routerd.request import Request
from syntrop.routerd.routing import Router
from syntrop.routerd.sse import event

logger = logging.getLogger(__name__)

Opened = tuple[scoring.Scored, str | None, AsyncGenerator[str, None]]


class Streams(Protocol):
    """What a relay needs of the gateway."""

    continuations: int
    admission: Admission
    changed: Callable[[], None]
    router: Router

    async def open_stream(self, request: Request,
                          candidates: list[scoring.Scored]) -> "Opened | ProviderError": ...


class Relay:
    """One streamed answer on its way to the client: chunks relayed as they
    come; when the provider fails after the first chunk and the answer is
    plain text, the same stream continues from the next candidate (the
    prompt replayed with the text already sent), announced by an SSE
    comment. The client sees one coherent stream: the first provider's id,
    created and model, no role twice, no text lost or repeated."""

    def __init__(self, gateway: Streams, request: Request,
                 candidates: list[scoring.Scored], current: scoring.Scored,
                 first: str | None, chunks: AsyncGenerator[str, None], kind: str) -> None:
        self.gateway, self.endpoint, self.request = gateway, request.endpoint, request
        self.candidates, self.current, self.kind = candidates, current, kind
        self.first, self.chunks = first, chunks
        self.sent: list[str] = []
        self.count = 0
        self.identity: dict[str, Any] | None = None
        self.finished = False
        #: Tool calls are never replayed: the request offers tools, or the
        #: answer has begun to call one.
        self.tools = bool(request.body.get("tools") or request.body.get("functions"))
        self.closed = False

    def _track(self, data: str, continued: bool) -> str | None:
        """Note what `data` carries; on a continuation, the chunk as the
        client should see it (None: nothing to send)."""
        try:
            chunk = json.loads(data)
            choice = chunk["choices"][0] if chunk.get("choices") else {}
        except (ValueError, TypeError, AttributeError, KeyError):
            self.tools = True  # not understood: not safe to replay
            return data
        if self.identity is None:
            self.identity = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and (delta.get("tool_calls") or delta.get("function_call")):
            self.tools = True
        text = (delta or {}).get("content") if self.endpoint == "chat/completions" else (
            choice.get("text") if isinstance(choice, dict) else None)
        if isinstance(text, str) and text:
            self.sent.append(text)
            self.count += 1
        if isinstance(choice, dict) and choice.get("finish_reason"):
            self.finished = True
        if not continued:
            return data
        chunk.update(self.identity)
        if isinstance(delta, dict):
            delta.pop("role", None)
            if not delta and not choice.get("finish_reason"):
                return None
        return json.dumps(chunk)

    async def run(self) -> AsyncIterator[bytes]:
        continued = False
        try:
            if self.first is not None:
                line = self._track(self.first, False)
                if line is not None:
                    yield event(line)
            while self.first is not None:
                try:
                    async for data in self.chunks:
                        line = self._track(data, continued)
                        if line is not None:
                            yield event(line)
                    break
                except Exception as caught:  # any provider failure: continue elsewhere
                    failure = caught if isinstance(caught, ProviderError) else ProviderError(
                        502, f"provider failed: {caught!r}")
                    failed = self.current
                    logger.warning("provider %s failed mid-stream: %s", failed.provider,
                                   failure.message)
                    self.gateway.router.failed(failed)
                    await self._close_chunks()
                    if self.finished:
                        break  # the answer was complete; only [DONE] was missing
                    if self.tools:
                        yield self._error(failure.message)
                        break
                    again = await self.gateway.open_stream(
                        self.request.continued("".join(self.sent), self.count),
                        [c for c in self.candidates if c.provider != failed.provider])
                    if isinstance(again, ProviderError):
                        yield self._error(f"{failure.message}; no provider could continue")
                        break
                    self.candidates = [c for c in self.candidates
                                       if c.provider != failed.provider]
                    self.current, first, self.chunks = again
                    self.gateway.continuations += 1
                    yield (f": routerd: {failed.provider} failed mid-stream; continued on "
                           f"{self.current.provider} from the text already sent\n\n").encode()
                    continued = True
                    if first is not None:
                        line = self._track(first, True)
                        if line is not None:
                            yield event(line)
            yield b"data: [DONE]\n\n"
        finally:
            await self.close()

    def _error(self, message: str) -> bytes:
        return event(json.dumps({"error": {"message": message, "type": "api_error",
                                           "param": None, "code": "upstream_error"}}))

    async def _close_chunks(self) -> None:
        await self.chunks.aclose()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self._close_chunks()
        finally:
            self.gateway.router.release(self.current)
            self.gateway.router.ended(self.current.provider)
            self.gateway.admission.leave(self.kind)
            self.gateway.changed()
