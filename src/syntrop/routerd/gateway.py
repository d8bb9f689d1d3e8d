"""The OpenAI API of routerd: validation, routing, retry before the first
token, OpenAI-shaped errors. Transport-free: http.py feeds it requests."""

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from syntrop.config import Paths
from syntrop.routerd import scoring
from syntrop.routerd.config import Config, ProviderConfig
from syntrop.routerd.providers import REGISTRY, Provider, ProviderError
from syntrop.routerd.sse import event

logger = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error",
               405: "invalid_request_error", 408: "invalid_request_error",
               413: "invalid_request_error", 502: "api_error", 504: "api_error"}
ENDPOINTS = {"/v1/chat/completions": "chat/completions", "/v1/completions": "completions"}
#: Seconds a provider's model list may take at start and Reload.
DISCOVERY_TIMEOUT = 5.0


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None


def error(status: int, message: str, code: str | None = None,
          param: str | None = None) -> Response:
    payload = {"error": {"message": message, "type": ERROR_TYPES.get(status, "api_error"),
                         "param": param, "code": code}}
    return Response(status, json.dumps(payload).encode())


def ok(payload: Any) -> Response:
    return Response(200, json.dumps(payload).encode())


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _check(endpoint: str, body: Any) -> None:
    """Types of the parameters routerd reads; the rest pass through."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if "model" in body and not isinstance(body["model"], str):
        raise BadRequest("model must be a string", "model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("stream must be a boolean", "stream")
    if endpoint == "chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest("messages must be a non-empty list of objects with a role",
                             "messages")
    elif not isinstance(body.get("prompt"), str):
        raise BadRequest("prompt must be a string", "prompt")
    for name in ("max_tokens", "max_completion_tokens", "seed"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or (name != "seed" and value < 1)):
            raise BadRequest(f"{name} must be a positive integer", name)
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not 0 <= value <= 2):
            raise BadRequest(f"{name} must be a number between 0 and 2", name)
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")


def _prompt_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """A cheap estimate: four characters a token."""
    if endpoint == "completions":
        return len(body["prompt"]) // 4 + 1
    return sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4 + 1


class Gateway:
    def __init__(self, config: Config, paths: Paths) -> None:
        self.paths = paths
        self.health: dict[str, scoring.Health] = {}
        self.requests_total = 0
        self.routing_errors = 0
        self.discovered: dict[str, tuple[str, ...]] = {}
        self.apply(config)

    def apply(self, config: Config) -> None:
        """Switch to `config`; requests in flight keep their providers."""
        self.config = config
        self.providers: dict[str, Provider] = {
            p.id: REGISTRY[p.kind](p, self.paths) for p in config.providers}
        self.health = {p.id: self.health.get(p.id) or scoring.Health()
                       for p in config.providers}

    async def discover(self) -> None:
        """Ask providers configured without a model list for theirs."""
        found: dict[str, tuple[str, ...]] = {}
        for config in self.config.providers:
            if config.models:
                continue
            try:
                models = await asyncio.wait_for(
                    self.providers[config.id].list_models(), DISCOVERY_TIMEOUT)
            except (ProviderError, TimeoutError) as failure:
                logger.warning("provider %s: no model list: %s", config.id, failure)
                continue
            found[config.id] = tuple(models)
        self.discovered = found

    def effective(self) -> tuple[ProviderConfig, ...]:
        """The providers with their model lists, configured or discovered."""
        from dataclasses import replace

        return tuple(p if p.models else replace(p, models=self.discovered.get(p.id, ()))
                     for p in self.config.providers)

    def models(self) -> list[tuple[str, str]]:
        """(model, provider) pairs, each model once, in configuration order."""
        seen: dict[str, str] = {}
        for provider in self.effective():
            for model in provider.models:
                seen.setdefault(model, provider.id)
        return list(seen.items())

    def default_model(self) -> str | None:
        if self.config.default_model:
            return self.config.default_model
        models = self.models()
        return models[0][0] if models else None

    def route(self, model: str, prompt_tokens: int | None = None) -> list[scoring.Scored]:
        return scoring.candidates(model, self.effective(), self.health, prompt_tokens)

    async def handle(self, method: str, path: str, body: bytes) -> Response:
        path = path.partition("?")[0]
        if path == "/health":
            return ok({"status": "ok", "providers": len(self.providers)})
        if path == "/v1/models":
            if method != "GET":
                return error(405, "use GET")
            data = [{"id": m, "object": "model", "created": 0, "owned_by": p}
                    for m, p in self.models()]
            data += [{"id": a, "object": "model", "created": 0, "owned_by": "routerd"}
                     for a in scoring.ALIASES]
            return ok({"object": "list", "data": data})
        endpoint = ENDPOINTS.get(path)
        if endpoint is None:
            return error(404, f"unknown endpoint {path}", "unknown_url")
        if method != "POST":
            return error(405, "use POST")
        self.requests_total += 1
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return error(400, "the request body is not valid JSON", "invalid_json")
        try:
            _check(endpoint, request)
        except BadRequest as bad:
            return error(400, str(bad), "invalid_value", bad.param)
        model = request.get("model") or self.default_model()
        if model is None:
            self.routing_errors += 1
            return error(404, "no model named and no default model", "model_not_found", "model")
        candidates = self.route(model, _prompt_tokens(endpoint, request))
        if not candidates:
            self.routing_errors += 1
            return error(404, f"the model {model!r} does not exist", "model_not_found", "model")
        if request.get("stream"):
            return await self._stream(endpoint, request, candidates)
        return await self._complete(endpoint, request, candidates)

    def _failed(self, failure: ProviderError) -> Response:
        self.routing_errors += 1
        code = "upstream_timeout" if failure.status == 504 else "upstream_error"
        return error(failure.status, failure.message, code)

    async def _complete(self, endpoint: str, request: dict[str, Any],
                        candidates: list[scoring.Scored]) -> Response:
        last = ProviderError(502, "no provider answered")
        for candidate in candidates:
            started = time.monotonic()
            provider = self.providers[candidate.provider]
            try:
                answer = await provider.complete(endpoint, {**request, "model": candidate.model})
            except ProviderError as failure:
                if not failure.retryable:
                    return error(failure.status, failure.message, "upstream_rejected")
                logger.warning("provider %s failed: %s", candidate.provider, failure.message)
                self.health[candidate.provider].failure()
                last = failure
                continue
            self.health[candidate.provider].success((time.monotonic() - started) * 1000)
            return ok(answer)
        return self._failed(last)

    async def _stream(self, endpoint: str, request: dict[str, Any],
                      candidates: list[scoring.Scored]) -> Response:
        last = ProviderError(502, "no provider answered")
        for candidate in candidates:
            started = time.monotonic()
            chunks = self.providers[candidate.provider].stream(
                endpoint, {**request, "model": candidate.model})
            try:
                first: str | None = await chunks.__anext__()
            except StopAsyncIteration:
                first = None
            except ProviderError as failure:
                await chunks.aclose()  # type: ignore[attr-defined]
                if not failure.retryable:
                    return error(failure.status, failure.message, "upstream_rejected")
                logger.warning("provider %s failed: %s", candidate.provider, failure.message)
                self.health[candidate.provider].failure()
                last = failure
                continue
            self.health[candidate.provider].success((time.monotonic() - started) * 1000)
            return Response(200, content_type="text/event-stream",
                            stream=self._relay(candidate.provider, first, chunks))
        return self._failed(last)

    async def _relay(self, provider: str, first: str | None,
                     chunks: AsyncIterator[str]) -> AsyncIterator[bytes]:
        try:
            if first is not None:
                yield event(first)
                async for data in chunks:
                    yield event(data)
        except ProviderError as failure:
            logger.warning("provider %s failed mid-stream: %s", provider, failure.message)
            self.health[provider].failure()
            yield event(json.dumps({"error": {"message": failure.message, "type": "api_error",
                                              "param": None, "code": "upstream_error"}}))
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        yield b"data: [DONE]\n\n"
