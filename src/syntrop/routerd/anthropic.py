"""Anthropic's Messages API (POST /v1/messages) over routerd's chat path.

A Messages request is translated into a chat completion request, routed
like any other (the same providers, affinity, limits and failover), and its
answer translated back: a message with text, thinking and tool_use blocks,
or, streamed, Anthropic's events (message_start, content_block_start,
content_block_delta, content_block_stop, message_delta, message_stop).
Errors come in Anthropic's shape ({"type": "error", "error": {...}}).

What maps to what:
- `system` (a string or text blocks) → a system message first;
- user content blocks: text → the message's text; tool_result → a `tool`
  message for its tool_use_id; images and documents are refused (400);
- assistant blocks: text → content, tool_use → tool_calls, thinking is
  dropped (the model's own thinking is not fed back);
- `max_tokens` (required), `stop_sequences` → stop, temperature, top_p,
  top_k, `tools` (input_schema → parameters), `tool_choice` (auto, any →
  required, tool → that function, none);
- `thinking: {type: enabled, budget_tokens: N}` → a reasoning budget
  (reasoning_effort: low ≤ 256 tokens, medium ≤ 1024, else high);
- finish reasons: stop → end_turn, length → max_tokens, tool_calls →
  tool_use. Which stop sequence matched is not known: stop_sequence is null.
"""

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from syntrop.routerd.api import BadRequest, Response, parse
from syntrop.routerd.sse import SSEParser

#: Anthropic's error type for each HTTP status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               408: "timeout_error", 413: "request_too_large", 415: "invalid_request_error",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "content_filter": "refusal"}
#: Chat fields passed on as they are.
_SAME = ("temperature", "top_p", "top_k")

Chat = Callable[[bytes], Awaitable[Response]]


def error(status: int, message: str) -> Response:
    payload = {"type": "error",
               "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}
    return Response(status, json.dumps(payload).encode())


def _text(content: Any, where: str) -> str:
    """The text of a string or a list of text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: a string or a list of content blocks", where)
    texts = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text" or \
                not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise BadRequest(f"{where}: only text blocks are supported here, not {kind!r}",
                             where)
        texts.append(block["text"])
    return "".join(texts)


def _user(content: Any, index: int) -> list[dict[str, Any]]:
    """One user turn as chat messages: tool results first (each answers a
    call of the turn before), then the text."""
    where = f"messages[{index}].content"
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: a string or a list of content blocks", where)
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            result = _text(block.get("content", ""), f"{where}.tool_result.content")
            if block.get("is_error") is True:
                result = f"Error: {result}"
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                        "content": result})
        else:
            raise BadRequest(f"{where}: content blocks of type {kind!r} are not supported "
                             "(text and tool_result are)", where)
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(content: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}].content"
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise BadRequest(f"{where}: a string or a list of content blocks", where)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and isinstance(block.get("id"), str) and \
                isinstance(block.get("name"), str):
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"],
                                       "arguments": json.dumps(block.get("input") or {})}})
        elif kind not in ("thinking", "redacted_thinking"):
            raise BadRequest(f"{where}: content blocks of type {kind!r} are not supported",
                             where)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(request: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = request.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools: a list", "tools")
        functions = []
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or \
                    not isinstance(tool.get("input_schema", {}), dict):
                raise BadRequest(f"tools[{index}]: name and input_schema (an object)",
                                 f"tools[{index}]")
            function = {"name": tool["name"],
                        "parameters": tool.get("input_schema") or {"type": "object"}}
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            functions.append({"type": "function", "function": function})
        out["tools"] = functions
    choice = request.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "tool" and isinstance(choice.get("name"), str):
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif kind in ("auto", "any", "none"):
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
        else:
            raise BadRequest("tool_choice: {type: auto | any | tool (with name) | none}",
                             "tool_choice")
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
            out["parallel_tool_calls"] = False
    return out


def _effort(thinking: Any) -> str | None:
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return "none"
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    if kind != "enabled" or not isinstance(budget, int) or isinstance(budget, bool) or \
            budget < 1:
        raise BadRequest("thinking: {type: enabled, budget_tokens: N >= 1} or "
                         "{type: disabled}", "thinking")
    return "low" if budget <= 256 else "medium" if budget <= 1024 else "high"


def to_chat(request: Any) -> dict[str, Any]:
    """A Messages request as a chat completion request. Raises BadRequest."""
    if not isinstance(request, dict):
        raise BadRequest("the request body must be a JSON object")
    max_tokens = request.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest("max_tokens: required, an integer >= 1", "max_tokens")
    turns = request.get("messages")
    if not isinstance(turns, list) or not turns:
        raise BadRequest("messages: a non-empty list", "messages")
    messages: list[dict[str, Any]] = []
    if request.get("system") is not None:
        messages.append({"role": "system", "content": _text(request["system"], "system")})
    for index, turn in enumerate(turns):
        role = turn.get("role") if isinstance(turn, dict) else None
        if role == "user":
            messages += _user(turn.get("content"), index)
        elif role == "assistant":
            messages.append(_assistant(turn.get("content"), index))
        else:
            raise BadRequest(f"messages[{index}].role: user or assistant",
                             f"messages[{index}].role")
    chat: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens}
    if request.get("model") is not None:
        chat["model"] = request["model"]
    for name in _SAME:
        if request.get(name) is not None:
            chat[name] = request[name]
    stops = request.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise BadRequest("stop_sequences: a list of strings", "stop_sequences")
        chat["stop"] = stops
    chat.update(_tools(request))
    effort = _effort(request.get("thinking"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    if request.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {"_raw": text}  # a call cut short: shown, never dropped


def from_chat(answer: dict[str, Any], model: str) -> dict[str, Any]:
    """A chat completion as a Messages reply."""
    choice = (answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"],
                        "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                        "input": _arguments(function.get("arguments") or "")})
    usage = answer.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"id": "msg_" + str(answer.get("id", "")).removeprefix("chatcmpl-"),
            "type": "message", "role": "assistant", "model": answer.get("model") or model,
            "content": content,
            "stop_reason": STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                      "output_tokens": usage.get("completion_tokens", 0),
                      "cache_read_input_tokens": cached or 0,
                      "cache_creation_input_tokens": 0}}


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


class _Events:
    """A chat completion stream's chunks as Messages events."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = False
        self.block = -1
        self.kind: str | None = None  # the open block's type
        self.tools: dict[int, int] = {}  # a chat tool call's index → its block
        self.stop = "end_turn"
        self.usage = {"input_tokens": 0, "output_tokens": 0}

    def _start(self, chunk: dict[str, Any]) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": "msg_" + str(chunk.get("id", "")).removeprefix("chatcmpl-"),
            "type": "message", "role": "assistant", "model": chunk.get("model") or self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [_event("message_start", {"message": message}), _event("ping", {})]

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.block += 1
        self.kind = block["type"]
        return [*out, _event("content_block_start", {"index": self.block,
                                                     "content_block": block})]

    def _close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [_event("content_block_stop", {"index": self.block})]

    def _delta(self, delta: dict[str, Any]) -> list[bytes]:
        return [_event("content_block_delta", {"index": self.block, "delta": delta})]

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out = self._start(chunk)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = {"input_tokens": usage.get("prompt_tokens", 0),
                          "output_tokens": usage.get("completion_tokens", 0)}
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if self.kind != "thinking":
                    out += self._open({"type": "thinking", "thinking": ""})
                out += self._delta({"type": "thinking_delta",
                                    "thinking": delta["reasoning_content"]})
            if delta.get("content"):
                if self.kind != "text":
                    out += self._open({"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                index = call.get("index", 0)
                function = call.get("function") or {}
                if index not in self.tools:
                    out += self._open({"type": "tool_use", "id": call.get("id"),
                                       "name": function.get("name"), "input": {}})
                    self.tools[index] = self.block
                if function.get("arguments"):
                    out += self._delta({"type": "input_json_delta",
                                        "partial_json": function["arguments"]})
            if choice.get("finish_reason"):
                self.stop = STOP_REASONS.get(choice["finish_reason"], "end_turn")
        return out

    def end(self) -> list[bytes]:
        out = self._start({})
        out += self._close()
        out.append(_event("message_delta", {"delta": {"stop_reason": self.stop,
                                                      "stop_sequence": None},
                                            "usage": self.usage}))
        out.append(_event("message_stop", {}))
        return out


async def _translate(chunks: AsyncIterator[bytes], model: str) -> AsyncIterator[bytes]:
    events = _Events(model)
    parser = SSEParser()
    async for part in chunks:
        for data in parser.feed(part):
            if data == "[DONE]":
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if isinstance(chunk, dict) and "error" in chunk:
                failure = chunk["error"] if isinstance(chunk["error"], dict) else {}
                yield _event("error", {"error": {"type": "api_error",
                                                 "message": failure.get("message", "error")}})
                return
            for out in events.chunk(chunk):
                yield out
    for out in events.end():
        yield out


def _from_error(response: Response) -> Response:
    """An OpenAI-shaped error answer in Anthropic's shape."""
    try:
        message = json.loads(response.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.body.decode("utf-8", "replace") or f"HTTP {response.status}"
    answer = error(response.status, message)
    answer.headers = response.headers
    return answer


async def messages(method: str, body: bytes, chat: Chat) -> Response:
    """POST /v1/messages: `chat` answers the translated request as
    /v1/chat/completions would."""
    if method != "POST":
        return error(405, "use POST")
    try:
        request = to_chat(parse(body))
    except BadRequest as bad:
        return error(400, str(bad))
    model = str(request.get("model", ""))
    response = await chat(json.dumps(request).encode())
    if response.status != 200:
        return _from_error(response)
    if response.stream is not None:
        return Response(200, content_type="text/event-stream",
                        stream=_translate(response.stream, model), closer=response.closer,
                        headers=response.headers)
    reply = from_chat(json.loads(response.body), model)
    return Response(200, json.dumps(reply).encode(), headers=response.headers)
