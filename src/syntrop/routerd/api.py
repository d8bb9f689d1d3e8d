"""The OpenAI API's shapes in routerd: responses and errors in OpenAI's
words, and the checks of the request fields routerd itself reads (the rest
pass through to providers). Pure; json only."""

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from syntrop.routerd import scoring

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
               403: "permission_error",
               404: "invalid_request_error",
               405: "invalid_request_error", 408: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error",
               431: "invalid_request_error",
               502: "api_error", 503: "api_error",
               504: "api_error"}
ENDPOINTS = {"/v1/chat/completions": "chat/completions", "/v1/completions": "completions",
             "/v1/embeddings": "embeddings"}
#: OpenAI's text to speech (routerd/speech.py).
SPEECH_PATH = "/v1/audio/speech"
#: Each endpoint's field that holds the prompt.
PROMPT_FIELDS = {"chat/completions": "messages", "completions": "prompt", "embeddings": "input"}
#: Most choices one request may ask for (n).
MAX_N = 8
#: Deepest nesting of lists and objects a request body may have.
MAX_DEPTH = 64
#: Most values (numbers, strings, lists, objects) a request body may hold:
#: parsed, each costs 24 to 64 bytes or more, so that 1 MiB of "{}," would
#: take 20 MiB. An OpenAI request has hundreds, a long chat a few thousand.
MAX_VALUES = 16384
#: A JSON string (escapes included), or a comma or opening bracket.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[,\[{]')


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _content(value: Any) -> bool:
    """A message's content: a string or a list of parts, each an object
    with a string type."""
    return isinstance(value, str) or (isinstance(value, list) and all(
        isinstance(part, dict) and isinstance(part.get("type"), str) for part in value))


Check = tuple[Callable[[Any], bool], str]
STRING: Check = (lambda v: isinstance(v, str), "a string")
BOOLEAN: Check = (lambda v: isinstance(v, bool), "a boolean")
OBJECT: Check = (lambda v: isinstance(v, dict), "an object")
NUMBER: Check = (_number, "a number")
INTEGER: Check = (_integer, "an integer")
#: The types of OpenAI's request fields (null is always accepted: unset);
#: ranges are checked by _check_sampling.
FIELDS: dict[str, Check] = {
    "model": STRING, "stream": BOOLEAN, "user": STRING, "suffix": STRING,
    "stop": (lambda v: isinstance(v, str) or _strings(v), "a string or a list of strings"),
    "frequency_penalty": NUMBER, "presence_penalty": NUMBER, "temperature": NUMBER,
    "top_p": NUMBER, "n": INTEGER, "seed": INTEGER, "max_tokens": INTEGER,
    "max_completion_tokens": INTEGER, "top_logprobs": INTEGER, "best_of": INTEGER,
    "dimensions": INTEGER, "logprobs": (lambda v: isinstance(v, bool) or _integer(v),
                                        "a boolean (an integer for completions)"),
    "echo": BOOLEAN, "parallel_tool_calls": BOOLEAN, "store": BOOLEAN,
    "logit_bias": (lambda v: isinstance(v, dict) and all(map(_number, v.values())),
                   "an object of numbers"),
    "metadata": OBJECT, "stream_options": OBJECT,
    "tools": (_objects, "a list of objects"),
    "tool_choice": (lambda v: isinstance(v, str | dict), "a string or an object"),
    "encoding_format": STRING, "reasoning_effort": STRING, "service_tier": STRING,
}
#: The types of a chat message's fields.
MESSAGE_FIELDS: dict[str, Check] = {
    "role": STRING, "name": STRING, "tool_call_id": STRING, "refusal": STRING,
    "content": (_content, "a string or a list of content parts"),
    "tool_calls": (_objects, "a list of objects"),
}

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


def unsupported_media(content_type: bytes | None) -> Response | None:
    """415 for a body declared as anything but JSON (no Content-Type is
    taken as JSON)."""
    if content_type is None or \
            content_type.partition(b";")[0].strip().lower() == b"application/json":
        return None
    return error(415, f"the request body must be JSON (Content-Type: application/json), not "
                 f"{content_type.decode('latin-1')[:100]!r}", "unsupported_media_type")


def served_by(candidate: scoring.Scored) -> tuple[tuple[bytes, bytes], ...]:
    """Which provider answers (a stream continued elsewhere says where it
    began)."""
    return ((b"x-syntrop-provider", candidate.provider.encode()),)


def ok(payload: Any) -> Response:
    return Response(200, json.dumps(payload).encode())


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def parse(body: bytes) -> Any:
    """The request body as JSON, nested at most MAX_DEPTH deep and of at
    most MAX_VALUES values, both checked without recursion; the count
    before parsing, since parsing is what costs the memory."""
    if _values(body) > MAX_VALUES:
        raise BadRequest(f"the request body holds over {MAX_VALUES} JSON values",
                         code="invalid_json")
    try:
        value = json.loads(body)
    except RecursionError:  # the decoder recurses: far too deep
        raise BadRequest(f"the request body is nested over {MAX_DEPTH} deep",
                         code="invalid_json") from None
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON", code="invalid_json") from None
    # Deeper than MAX_DEPTH needs more brackets than that: most bodies skip the walk.
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise BadRequest(f"the request body is nested over {MAX_DEPTH} deep",
                         code="invalid_json")
    return value


def _values(body: bytes) -> int:
    """About how many values `body` holds (its commas and opening brackets
    outside strings, plus one): counted in the whole body first, and only
    when that is over MAX_VALUES again with strings skipped, one token at a
    time (nothing kept) and no further than MAX_VALUES."""
    found = body.count(b",") + body.count(b"[") + body.count(b"{") + 1
    if found <= MAX_VALUES:
        return found
    found = 1
    for token in _TOKEN.finditer(body):
        if token.end() - token.start() == 1:  # not a string
            found += 1
            if found > MAX_VALUES:
                break
    return found


def _depth(value: Any) -> int:
    """How deep lists and objects nest in `value` (without recursion)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                pending.append((child, depth + 1))
        deepest = max(deepest, depth)
    return deepest


def check(endpoint: str, body: Any) -> None:
    """Types of the OpenAI request fields (each BadRequest names its
    field); fields OpenAI does not define pass through unchecked."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name, value in body.items():
        kind = FIELDS.get(name)
        if kind is not None and value is not None and not kind[0](value):
            raise BadRequest(f"{name} must be {kind[1]}", name)
    if endpoint == "embeddings":
        _check_embeddings(body)
    elif endpoint == "chat/completions":
        _check_messages(body.get("messages"))
    elif not isinstance(body.get("prompt"), str):
        raise BadRequest("prompt must be a string", "prompt")
    _check_sampling(body)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of objects", "messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be an object", where)
        if not isinstance(message.get("role"), str):
            raise BadRequest(f"{where}.role must be a string", f"{where}.role")
        for name, value in message.items():
            kind = MESSAGE_FIELDS.get(name)
            if kind is not None and value is not None and not kind[0](value):
                raise BadRequest(f"{where}.{name} must be {kind[1]}", f"{where}.{name}")


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
