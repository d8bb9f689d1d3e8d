"""routerd's gateway: the endpoints, retry before the first token,
admission, and the counters /metrics shows. Who serves what is
registry.py's; offload (runtimed's load, LAN peers), offload.py's;
choosing a candidate, routing.py's. The OpenAI shapes and checks are
api.py's, a request parsed once into its record request.py's (a prefill
hand-off rides beside it: Handed); a stream's relay and its continuation mid-answer, relay.py's.
Transport-free: http.py feeds it requests."""

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from syntrop.config import Paths
from syntrop.routerd import scoring
from syntrop.routerd.api import (
    ENDPOINTS,
    SPEECH_PATH,
    BadRequest,
    Response,
    error,
    ok,
    served_by,
)
from syntrop.routerd.config import Config
from syntrop.routerd.handoff import PREFILL_PATH, Handoff
from syntrop.routerd.offload import Offload
from syntrop.routerd.pressure import Pressure
from syntrop.routerd.providers import Provider, ProviderError
from syntrop.routerd.providers.base import Handed
from syntrop.routerd.queues import USER, Admission
from syntrop.routerd.registry import Registry
from syntrop.routerd.relay import Opened, Relay
from syntrop.routerd.request import Request, read
from syntrop.routerd.routing import Router

if TYPE_CHECKING:  # imported on first use: SQLite has no place in the memory budget before
    from syntrop.routerd.responses import Responses

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Where rerank is asked for (llama-server's four spellings).
RERANK_PATHS = frozenset({"/v1/rerank", "/rerank", "/v1/reranking", "/reranking"})


class Gateway:
    """One request from its bytes to its response: the registry, offload
    and router it routes by (`registry`, `offload`, `router`)."""

    def __init__(self, config: Config, paths: Paths,
                 pressure: Pressure | None = None) -> None:
        self.registry = Registry(config, paths)
        self.paths = paths
        #: Stored responses (POST /v1/responses), opened on first use.
        self._responses: Responses | None = None
        self.offload = Offload(self.registry, pressure or Pressure(
            config.psi_threshold, path=config.psi_file))
        self.router = Router(self.registry, self.offload)
        self.handoff = Handoff(self.registry)
        self.requests_total = 0
        self.continuations = 0
        #: (endpoint path, status) -> answers, for /metrics.
        self.answered: dict[tuple[str, int], int] = {}
        #: Called when a request ends (the fleet publishes the load anew).
        self.changed: Callable[[], None] = lambda: None
        self._settle(config)

    def close(self) -> None:
        if self._responses is not None:
            self._responses.store.close()

    def apply(self, config: Config) -> None:
        """Switch to `config`; requests in flight keep their providers."""
        self._settle(config)
        self.registry.apply(config)

    def _settle(self, config: Config) -> None:
        """The gateway's own part of `config`: pressure and admission."""
        self.config = config
        pressure = self.offload.pressure
        pressure.threshold, pressure.path = config.psi_threshold, config.psi_file
        self.admission = Admission(config.max_inflight, config.triage_reserved)

    # requests ---------------------------------------------------------------

    async def handle(self, method: str, path: str, body: bytes,
                     traffic: str = USER, forwarded: bool = False,
                     caller: str = "") -> Response:
        """One request; `forwarded`: another node of the fleet sent it (it
        is served by this node's own providers); `caller`: its API key as
        http.py names it ("" without keys), whose stored responses it sees."""
        path = path.partition("?")[0]
        response = await self._handle(method, path, body, traffic, forwarded, caller)
        known = path in ENDPOINTS or path in RERANK_PATHS or \
            path in ("/v1/models", "/health", "/v1/messages", "/v1/responses", SPEECH_PATH)
        key = ("/v1/models/{id}" if path.startswith("/v1/models/") else
               "/v1/responses/{id}" if path.startswith("/v1/responses/") else
               path if known else "other",
               response.status)
        self.answered[key] = self.answered.get(key, 0) + 1
        return response

    async def _handle(self, method: str, path: str, body: bytes, traffic: str,
                      forwarded: bool, caller: str = "") -> Response:
        if path == "/health":  # also what LAN peers advertise to each other
            from syntrop.routerd.pressure import free_accelerator_bytes

            return ok({"status": "ok", "providers": len(self.registry.providers),
                       "memory_some": self.offload.pressure.memory_some(),
                       "free_accelerator_bytes": free_accelerator_bytes()})
        if path == "/metrics":
            from syntrop.routerd.metrics import render

            return Response(200, render(self).encode(),
                            "text/plain; version=0.0.4; charset=utf-8")
        if path == "/v1/models" or path.startswith("/v1/models/"):
            return await self._models(method, path)
        if path == PREFILL_PATH:
            return await self._prefill(method, body, traffic, forwarded)
        if path in RERANK_PATHS or path in ("/v1/messages", "/v1/responses") or \
                path.startswith("/v1/responses/"):
            return await self._translated(method, path, body, traffic, forwarded, caller)
        if path == SPEECH_PATH:
            from syntrop.routerd.speech import speech

            return await speech(self, method, body, traffic)
        endpoint = ENDPOINTS.get(path)
        if endpoint is None:
            return error(404, f"unknown endpoint {path}", "unknown_url")
        if method != "POST":
            return error(405, "use POST")
        return await self._routed(endpoint, body, traffic, forwarded)

    async def _routed(self, endpoint: str, body: bytes, traffic: str,
                      forwarded: bool) -> Response:
        """An OpenAI request (`endpoint`: chat/completions, completions or
        embeddings): parsed once (request.py), admitted, routed, answered or
        streamed."""
        self.requests_total += 1
        try:
            request = read(endpoint, body)
        except BadRequest as bad:
            return error(400, str(bad), bad.code, bad.param)
        asked = request.handoff if forwarded else None  # only another node names a helper
        model = request.model or self.registry.default_model()
        if model is None:
            self.router.routing_errors += 1
            return error(404, "no model named and no default model", "model_not_found", "model")
        deadline = time.monotonic() + self.config.deadline
        if (refused := await self._admit(traffic)) is not None:
            return refused
        stream = None
        handed: Handed | None = None
        said: tuple[tuple[bytes, bytes], ...] = ()
        try:
            request = request.of(model)
            chain = self.router.chain(request.turns, model)
            candidates = await self.router.usable(endpoint, model, request.tokens, deadline,
                                                  chain, forwarded)
            if isinstance(candidates, Response):
                return candidates
            if endpoint == "chat/completions":
                handed, said = await self._hand_off(request, candidates, asked)
            if not request.stream:
                response = await self._complete(request, candidates, chain, handed)
                response.headers += said
                return response
            opened = await self.open_stream(request, candidates, handed)
            if isinstance(opened, ProviderError):
                return self._failed(opened)
            current, first, chunks = opened
            self.registry.affinity.routed(current.provider, current.model, chain)
            stream = Relay(self, request, candidates, current, first, chunks, traffic)
            return Response(200, content_type="text/event-stream", stream=stream.run(),
                            headers=served_by(current) + said,
                            closer=stream.close)
        finally:
            # A state no provider took (a continuation elsewhere prefills itself).
            if handed is not None:
                handed.close()
            if stream is None:
                self.admission.leave(traffic)
                self.changed()

    async def _hand_off(self, request: Request, candidates: list[scoring.Scored], asked: Any,
                        ) -> tuple[Handed | None, tuple[tuple[bytes, bytes], ...]]:
        """The prefill hand-off (handoff.py) for a chat: a state pulled for
        this node's runtimed, or the helper named for the member that
        answers; with the header that says so (none without a hand-off).
        The caller closes it (a state no provider took)."""
        if asked is not None:  # a member routed it here, naming its helper
            named = self.handoff.helper(asked)
            if named is None or (fd := await self.handoff.pull(named, request)) is None:
                return None, ()
            return Handed(fd), ((b"x-syntrop-handoff", self.registry.node_of(named).encode()),)
        planned = await self.handoff.plan(candidates, request.tokens)
        if planned is None:
            return None, ()
        target, helper = planned
        node = self.registry.node_of(helper.provider)
        if target.provider in {p.id for p in self.registry.fleet}:
            handed = Handed(helper=node, member=target.provider)  # the member pulls it
        elif (fd := await self.handoff.pull(helper.provider,
                                            request.of(helper.model))) is not None:
            handed = Handed(fd)
        else:
            return None, ()
        return handed, ((b"x-syntrop-handoff", node.encode()),)

    async def _admit(self, traffic: str) -> Response | None:
        """Take a place among the requests in flight (waiting at most the
        deadline); a 503 when none came. The caller leaves it."""
        if self.admission.try_enter(traffic):
            return None
        try:
            async with asyncio.timeout(self.config.deadline):
                await self.admission.enter(traffic)
        except TimeoutError:
            return error(503, "routerd is at its limit of requests in flight",
                         "server_overloaded")
        return None

    async def _prefill(self, method: str, body: bytes, traffic: str,
                       forwarded: bool) -> Response:
        """POST /v1/syntrop/prefill, for the fleet's members (`forwarded`:
        http.py says so only over mutual TLS; to anyone else it is an
        unknown endpoint): admitted and counted as a model request, its
        place held until the state is sent or abandoned (the closer)."""
        if not forwarded:
            return error(404, f"unknown endpoint {PREFILL_PATH}", "unknown_url")
        self.requests_total += 1
        if (refused := await self._admit(traffic)) is not None:
            return refused
        try:
            response = await self.handoff.serve(method, body)
        except BaseException:
            self._leave(traffic)
            raise
        closer = response.closer
        if closer is None:  # refused: nothing to send but the answer
            self._leave(traffic)
            return response

        async def close() -> None:
            try:
                await closer()
            finally:
                self._leave(traffic)

        response.closer = close
        return response

    def _leave(self, traffic: str) -> None:
        self.admission.leave(traffic)
        self.changed()

    async def _translated(self, method: str, path: str, body: bytes, traffic: str,
                          forwarded: bool, caller: str) -> Response:
        """Rerank, Responses and Anthropic's Messages: other APIs, translated
        onto embeddings and chat (routed as those are)."""
        if path == "/v1/responses" or path.startswith("/v1/responses/"):
            if self._responses is None:
                from syntrop.routerd.responses import Responses, Store

                self._responses = Responses(Store(self.paths.state / "responses.sqlite"))
            return await self._responses.handle(method, path, body, lambda chat: self._handle(
                "POST", "/v1/chat/completions", chat, traffic, forwarded), caller)
        if path in RERANK_PATHS:
            from syntrop.routerd.rerank import rerank

            return await rerank(method, body, lambda asked: self._handle(
                method, "/v1/embeddings", asked, traffic, forwarded))
        from syntrop.routerd.anthropic import messages

        return await messages(method, body, lambda chat: self._handle(
            method, "/v1/chat/completions", chat, traffic, forwarded))

    async def _models(self, method: str, path: str) -> Response:
        """GET /v1/models and /v1/models/{id}: every provider's, and the aliases."""
        if method != "GET":
            return error(405, "use GET")
        await self.registry.rediscover()
        data = [{"id": m, "object": "model", "created": 0, "owned_by": p}
                for m, p in self.registry.models()]
        data += [{"id": a, "object": "model", "created": 0, "owned_by": "routerd"}
                 for a in scoring.ALIASES]
        if path == "/v1/models":
            return ok({"object": "list", "data": data})
        from urllib.parse import unquote

        wanted = unquote(path.removeprefix("/v1/models/"))
        found = next((m for m in data if m["id"] == wanted), None)
        return ok(found) if found is not None else error(
            404, f"no provider lists the model {wanted!r}", "model_not_found", "model")

    def _failed(self, failure: ProviderError) -> Response:
        if not failure.retryable:
            return error(failure.status, failure.message, "upstream_rejected")
        self.router.routing_errors += 1
        code = "upstream_timeout" if failure.status == 504 else "upstream_error"
        return error(failure.status, failure.message, code)

    async def _attempt(self, candidates: list[scoring.Scored],
                       start: Callable[[scoring.Scored, Provider], Awaitable[T]],
                       ) -> tuple[scoring.Scored, T] | ProviderError:
        """The one walk over `candidates` (best first) that answering and
        streaming share: a candidate its breaker holds back is skipped; a
        retryable failure is counted against it and the next is tried; a
        failure that is the request's own (not retryable) ends the walk.
        The first candidate whose `start` succeeds and what it gave; else
        that failure, or the last one."""
        router = self.router
        last = ProviderError(502, "no provider answered")
        for candidate in candidates:
            breaker = router.breaker(candidate)
            if not breaker.acquire(time.monotonic()):
                continue
            started = time.monotonic()
            try:
                found = await start(candidate, self.registry.providers[candidate.provider])
            except ProviderError as failure:
                if not failure.retryable:
                    breaker.release()
                    return failure
                logger.warning("provider %s failed: %s", candidate.provider, failure.message)
                router.failed(candidate)
                last = failure
                continue
            except BaseException:
                breaker.release()
                raise
            router.succeeded(candidate, (time.monotonic() - started) * 1000)
            return candidate, found
        return last

    async def _complete(self, request: Request, candidates: list[scoring.Scored],
                        chain: Sequence[tuple[str, int]] = (),
                        handed: Handed | None = None) -> Response:
        async def answer(candidate: scoring.Scored, provider: Provider) -> dict[str, Any] | bytes:
            try:
                return await provider.complete(request.of(candidate.model), handed)
            finally:
                self.router.ended(candidate.provider)

        answered = await self._attempt(candidates, answer)
        if isinstance(answered, ProviderError):
            return self._failed(answered)
        candidate, found = answered
        self.registry.affinity.routed(candidate.provider, candidate.model, chain)
        body = found if isinstance(found, bytes) else json.dumps(found).encode()
        return Response(200, body, headers=served_by(candidate))

    async def open_stream(self, request: Request, candidates: list[scoring.Scored],
                          handed: Handed | None = None) -> "Opened | ProviderError":
        """The first candidate that answers a first chunk: it, the chunk
        and the rest; or the last failure."""
        async def first_chunk(candidate: scoring.Scored, provider: Provider,
                              ) -> tuple[str | None, AsyncGenerator[str, None]]:
            chunks = provider.stream(request.of(candidate.model), handed)
            try:
                return await chunks.__anext__(), chunks
            except StopAsyncIteration:
                return None, chunks
            except BaseException:
                await chunks.aclose()
                raise

        opened = await self._attempt(candidates, first_chunk)
        if isinstance(opened, ProviderError):
            return opened
        candidate, (first, chunks) = opened
        return candidate, first, chunks
