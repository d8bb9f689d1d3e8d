"""The OpenAI API's shapes in routerd: responses and errors in OpenAI's
words, and the checks of the request fields routerd itself reads (the rest
pass through to providers). Pure; json only."""

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from syntrop.routerd import scoring

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
               404: "invalid_request_error",
               405: "invalid_request_error", 408: "invalid_request_error",
               413: "invalid_request_error", 431: "invalid_request_error",
               502: "api_error", 503: "api_error",
               504: "api_error"}
ENDPOINTS = {"/v1/chat/completions": "chat/completions", "/v1/completions": "completions",
             "/v1/embeddings": "embeddings"}
#: Most choices one request may ask for (n).
MAX_N = 8

@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None
    #: Called once the response is sent or abandoned (a stream's resources).
    closer: Callable[[], Awaitable[None]] | None = None
    #: More response headers.
    headers: tuple[tuple[bytes, bytes], ...] = ()


def error(status: int, message: str, code: str | None = None,
          param: str | None = None) -> Response:
    payload = {"error": {"message": message, "type": ERROR_TYPES.get(status, "api_error"),
                         "param": param, "code": code}}
    return Response(status, json.dumps(payload).encode())


def unauthorized() -> Response:
    """401 in OpenAI's words, for a request without a configured API key."""
    response = error(401, "no valid API key: send Authorization: Bearer KEY with a key "
                     "routerd is configured with", "invalid_api_key")
    response.headers = ((b"www-authenticate", b'Bearer realm="routerd"'),)
    return response


def served_by(candidate: scoring.Scored) -> tuple[tuple[bytes, bytes], ...]:
    """Which provider answers (a stream continued elsewhere says where it
    began)."""
    return ((b"x-syntrop-provider", candidate.provider.encode()),)


def ok(payload: Any) -> Response:
    return Response(200, json.dumps(payload).encode())


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def check(endpoint: str, body: Any) -> None:
    """Types of the parameters routerd reads; the rest pass through."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if "model" in body and not isinstance(body["model"], str):
        raise BadRequest("model must be a string", "model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("stream must be a boolean", "stream")
    if endpoint == "embeddings":
        _check_embeddings(body)
    elif endpoint == "chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest("messages must be a non-empty list of objects with a role",
                             "messages")
    elif not isinstance(body.get("prompt"), str):
        raise BadRequest("prompt must be a string", "prompt")
    _check_sampling(body)


def _check_embeddings(body: dict[str, Any]) -> None:
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest("input must be a string or a non-empty list of strings", "input")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise BadRequest("encoding_format must be float or base64", "encoding_format")
    if body.get("stream"):
        raise BadRequest("embeddings are not streamed", "stream")


def _check_sampling(body: dict[str, Any]) -> None:
    """The token budget, seed, temperature, top_p, n and response_format."""
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
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N):
        raise BadRequest(f"n must be an integer from 1 to {MAX_N}", "n")
    if "response_format" in body:
        _check_response_format(body["response_format"])


def _check_response_format(value: Any) -> None:
    """OpenAI's response_format: text, json_object, or json_schema with a
    schema object (strict is accepted: runtimed's constraint is always
    strict)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise BadRequest("response_format.type must be text, json_object or json_schema",
                         "response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict) \
                or not isinstance(spec.get("name", ""), str):
            raise BadRequest("response_format.json_schema must be an object with a name and a "
                             "schema object", "response_format")


def prompt_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """A cheap estimate: four characters a token."""
    if endpoint == "completions":
        return len(body["prompt"]) // 4 + 1
    if endpoint == "embeddings":
        texts = body["input"]
        return sum(map(len, [texts] if isinstance(texts, str) else texts)) // 4 + 1
    return sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4 + 1
