"""OpenAI's Responses API (POST /v1/responses), stateful, over routerd's chat
path; GET and DELETE /v1/responses/{id}.

A request's `input` (a string, or message, function_call and
function_call_output items) is appended to the conversation of
`previous_response_id`, if any, and asked as one chat completion: routed
like any other, so the same providers, affinity (a continued conversation
shares its prefix, so it goes where that prefix is warm), limits and
failover. The answer becomes output items (reasoning, message,
function_call) and, unless `store` is false, the response and its whole
conversation are kept in routerd's state directory (responses.sqlite), so a
later request continues it by id. `instructions` are the request's own (as
OpenAI's API has it, they do not carry over to a continuation). Kept: at most
MAX_STORED responses, each at most TTL seconds; the oldest go first.

What maps to what: `max_output_tokens` → max_tokens; temperature, top_p;
function `tools` (flat, as this API writes them) and `tool_choice`;
`text.format` (json_schema, json_object, text) → response_format;
`reasoning.effort` → reasoning_effort; finish reason length → status
"incomplete" (max_output_tokens). Built-in tools (web search, files, ...) and
image or file inputs are refused (400).
"""

import json
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from syntrop.routerd.api import BadRequest, Response, error, ok, parse
from syntrop.routerd.sse import SSEParser

#: Most responses kept; the oldest go first.
MAX_STORED = 10_000
#: Seconds a stored response is kept (30 days).
TTL = 30 * 86400
MIGRATIONS = ("CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, "
              "conversation TEXT NOT NULL, response TEXT NOT NULL);"
              "CREATE INDEX responses_created ON responses (created)",
              # Whose it is: the API key that made it, as http.py names it.
              "ALTER TABLE responses ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
_TEXT_PARTS = ("input_text", "output_text", "text")

Chat = Callable[[bytes], Awaitable[Response]]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class Store:
    """Stored responses and their conversations, in SQLite (opened on first
    use: routerd's memory budget has no room for it otherwise)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._database: Any = None

    def _db(self) -> Any:
        if self._database is None:
            from syntrop.system.sqlite import Database

            self._database = Database(self.path, MIGRATIONS)
        return self._database

    async def get(self, response_id: str,
                  owner: str = "") -> tuple[list[Any], dict[str, Any]] | None:
        def read(c: sqlite3.Connection) -> tuple[str, str] | None:
            row = c.execute("SELECT conversation, response FROM responses "
                            "WHERE id = ? AND owner = ? AND created > ?",
                            (response_id, owner, time.time() - TTL)).fetchone()
            return None if row is None else (row[0], row[1])

        found = await self._db().run(read)
        return None if found is None else (json.loads(found[0]), json.loads(found[1]))

    async def put(self, response: dict[str, Any], conversation: list[Any],
                  owner: str = "") -> None:
        def write(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                      (response["id"], time.time(), json.dumps(conversation),
                       json.dumps(response), owner))
            c.execute("DELETE FROM responses WHERE created <= ?", (time.time() - TTL,))
            c.execute("DELETE FROM responses WHERE id IN (SELECT id FROM responses "
                      "ORDER BY created DESC LIMIT -1 OFFSET ?)", (MAX_STORED,))

        await self._db().run(write)

    async def delete(self, response_id: str, owner: str = "") -> bool:
        def remove(c: sqlite3.Connection) -> bool:
            return c.execute("DELETE FROM responses WHERE id = ? AND owner = ?",
                             (response_id, owner)).rowcount > 0

        return bool(await self._db().run(remove))

    def close(self) -> None:
        if self._database is not None:
            self._database.close()


# requests --------------------------------------------------------------------


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: a string or a list of content parts", where)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise BadRequest(f"{where}: content parts of type {kind!r} are not supported "
                             "(input_text and output_text are)", where)
        texts.append(part["text"])
    return "".join(texts)


def items(value: Any) -> list[dict[str, Any]]:
    """`input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise BadRequest("input: a string or a non-empty list of items", "input")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{index}]: an object", f"input[{index}]")
    return value


def messages(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's items as chat messages; consecutive function calls
    become one assistant message's tool calls."""
    out: list[dict[str, Any]] = []
    for index, item in enumerate(conversation):
        kind = item.get("type", "message")
        where = f"input[{index}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise BadRequest(f"{where}.role: user, assistant, system or developer",
                                 f"{where}.role")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _content_text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise BadRequest(f"{where}: call_id, name and arguments (strings)", where)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"),
                                                                           str):
                raise BadRequest(f"{where}: call_id and output (strings)", where)
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": item["output"]})
        elif kind != "reasoning":  # the model's own thinking is not fed back
            raise BadRequest(f"{where}: items of type {kind!r} are not supported", where)
    return out


def _tools(request: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = request.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise BadRequest("tools: a list", "tools")
        functions = []
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function" or \
                    not isinstance(tool.get("name"), str):
                kind = tool.get("type") if isinstance(tool, dict) else None
                raise BadRequest(f"tools[{index}]: only function tools are supported, "
                                 f"not {kind!r}", f"tools[{index}]")
            function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                        if tool.get(k) is not None}
            functions.append({"type": "function", "function": function})
        chat["tools"] = functions
    choice = request.get("tool_choice")
    if choice is None:
        return
    if isinstance(choice, dict) and choice.get("type") == "function" and \
            isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice in ("auto", "none", "required"):
        chat["tool_choice"] = choice
    else:
        raise BadRequest("tool_choice: auto, none, required or {type: function, name}",
                         "tool_choice")


def _format(request: dict[str, Any], chat: dict[str, Any]) -> None:
    text = request.get("text")
    if text is None:
        return
    form = text.get("format") if isinstance(text, dict) else None
    kind = form.get("type") if isinstance(form, dict) else None
    if form is None or kind == "text":
        return
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind == "json_schema" and isinstance(form, dict) and \
            isinstance(form.get("schema"), dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": form.get("name", "answer"), "schema": form["schema"],
            "strict": form.get("strict", True)}}
    else:
        raise BadRequest("text.format: {type: text | json_object | json_schema (with "
                         "schema)}", "text.format")


def to_chat(request: dict[str, Any], conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion request that answers `request` after `conversation`."""
    chat: dict[str, Any] = {"messages": messages(conversation)}
    instructions = request.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions: a string", "instructions")
        chat["messages"].insert(0, {"role": "system", "content": instructions})
    if request.get("model") is not None:
        chat["model"] = request["model"]
    limit = request.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise BadRequest("max_output_tokens: an integer >= 1", "max_output_tokens")
        chat["max_tokens"] = limit
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if request.get(name) is not None:
            chat[name] = request[name]
    _tools(request, chat)
    _format(request, chat)
    reasoning = request.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if request.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# answers ---------------------------------------------------------------------


def output(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat answer's message as output items."""
    out: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        out.append({"type": "reasoning", "id": _new_id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text",
                                 "text": message["reasoning_content"]}]})
    if message.get("content"):
        out.append({"type": "message", "id": _new_id("msg"), "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": message["content"],
                                 "annotations": []}]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        out.append({"type": "function_call", "id": _new_id("fc"), "call_id": call.get("id"),
                    "name": function.get("name"), "arguments": function.get("arguments", ""),
                    "status": "completed"})
    return out


def response(request: dict[str, Any], response_id: str, created: int, model: str,
             finish: str | None, items_out: list[dict[str, Any]],
             usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    complete = finish != "length"
    return {
        "id": response_id, "object": "response", "created_at": created,
        "status": "completed" if complete else "incomplete",
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "error": None, "model": model, "output": items_out,
        "previous_response_id": request.get("previous_response_id"),
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "temperature": request.get("temperature"), "top_p": request.get("top_p"),
        "tools": request.get("tools") or [], "tool_choice": request.get("tool_choice", "auto"),
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "text": request.get("text") or {"format": {"type": "text"}},
        "reasoning": request.get("reasoning"), "store": request.get("store", True) is not False,
        "metadata": request.get("metadata") or {},
        "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                  "input_tokens_details": {"cached_tokens": (
                      usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)},
                  "output_tokens": usage.get("completion_tokens", 0),
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage.get("total_tokens", 0)},
    }


def _stored_items(items_out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items as the conversation keeps them (the input's shapes)."""
    kept = []
    for item in items_out:
        if item["type"] == "message":
            kept.append({"type": "message", "role": "assistant",
                         "content": item["content"][0]["text"]})
        elif item["type"] == "function_call":
            kept.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
    return kept


class _Stream:
    """A chat stream's chunks as Responses events; the whole answer kept
    for the final response."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # output items, as they stand
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.calls: dict[int, dict[str, Any]] = {}  # a chat tool call's index → its item
        self.model = ""
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def event(self, kind: str, **payload: Any) -> bytes:
        self.sequence += 1
        data = json.dumps({"type": kind, "sequence_number": self.sequence, **payload})
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def _index(self) -> int:
        return len(self.items) - 1

    def _close(self) -> list[bytes]:
        item, self.open = self.open, None
        if item is None:
            return []
        at = self.items.index(item)
        out = []
        if item["type"] == "message":
            part = item["content"][0]
            out += [self.event("response.output_text.done", item_id=item["id"], output_index=at,
                               content_index=0, text=part["text"]),
                    self.event("response.content_part.done", item_id=item["id"],
                               output_index=at, content_index=0, part=part)]
        elif item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", item_id=item["id"],
                                  output_index=at, content_index=0,
                                  text=item["content"][0]["text"]))
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=at, arguments=item["arguments"]))
        item["status"] = "completed"
        out.append(self.event("response.output_item.done", output_index=at, item=item))
        return out

    def _open(self, item: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.items.append(item)
        self.open = item
        added = {**item, "status": "in_progress"}
        if item["type"] in ("message", "reasoning"):
            added["content"] = []  # its text comes as deltas
        out.append(self.event("response.output_item.added", output_index=self._index(),
                              item=added))
        if item["type"] == "message":
            out.append(self.event("response.content_part.added", item_id=item["id"],
                                  output_index=self._index(), content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        self.model = chunk.get("model") or self.model
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if self.open is None or self.open["type"] != "reasoning":
                    out += self._open({"type": "reasoning", "id": _new_id("rs"), "summary": [],
                                       "content": [{"type": "reasoning_text", "text": ""}]})
                assert self.open is not None
                self.open["content"][0]["text"] += delta["reasoning_content"]
                out.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                      output_index=self._index(), content_index=0,
                                      delta=delta["reasoning_content"]))
            if delta.get("content"):
                if self.open is None or self.open["type"] != "message":
                    out += self._open({"type": "message", "id": _new_id("msg"),
                                       "status": "in_progress", "role": "assistant",
                                       "content": [{"type": "output_text", "text": "",
                                                    "annotations": []}]})
                assert self.open is not None
                self.open["content"][0]["text"] += delta["content"]
                out.append(self.event("response.output_text.delta", item_id=self.open["id"],
                                      output_index=self._index(), content_index=0,
                                      delta=delta["content"], logprobs=[]))
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if call.get("index", 0) not in self.calls:
                    item = {"type": "function_call", "id": _new_id("fc"),
                            "call_id": call.get("id"), "name": function.get("name"),
                            "arguments": ""}
                    out += self._open(item)
                    self.calls[call.get("index", 0)] = item
                item = self.calls[call.get("index", 0)]
                if function.get("arguments"):
                    item["arguments"] += function["arguments"]
                    # the call's own item: calls' fragments may interleave
                    out.append(self.event("response.function_call_arguments.delta",
                                          item_id=item["id"],
                                          output_index=self.items.index(item),
                                          delta=function["arguments"]))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out


class Responses:
    """The endpoints, over a chat function and a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def handle(self, method: str, path: str, body: bytes, chat: Chat,
                     owner: str = "") -> Response:
        """One request of `owner` (the caller's API key as http.py names it;
        "" without keys): it sees, continues and deletes only its own."""
        if path != "/v1/responses":
            response_id = path.removeprefix("/v1/responses/")
            if method == "GET":
                found = await self.store.get(response_id, owner)
                if found is None:
                    return error(404, f"no response {response_id!r}", "response_not_found")
                return ok(found[1])
            if method == "DELETE":
                if not await self.store.delete(response_id, owner):
                    return error(404, f"no response {response_id!r}", "response_not_found")
                return ok({"id": response_id, "object": "response.deleted", "deleted": True})
            return error(405, "use GET or DELETE")
        if method != "POST":
            return error(405, "use POST")
        try:
            request = parse(body)
            if not isinstance(request, dict):
                raise BadRequest("the request body must be a JSON object")
            conversation = await self._conversation(request, owner)
            asked = to_chat(request, conversation)
        except BadRequest as bad:
            return error(404 if bad.code == "response_not_found" else 400, str(bad),
                         bad.code, bad.param)
        answer = await chat(json.dumps(asked).encode())
        if answer.status != 200:
            return answer
        response_id, created = _new_id("resp"), int(time.time())
        if answer.stream is not None:
            return Response(200, content_type="text/event-stream", closer=answer.closer,
                            headers=answer.headers, stream=self._stream(
                                request, conversation, answer.stream, response_id, created,
                                str(asked.get("model", "")), owner))
        whole = json.loads(answer.body)
        choice = (whole.get("choices") or [{}])[0]
        items_out = output(choice.get("message") or {})
        reply = response(request, response_id, created, whole.get("model") or "",
                         choice.get("finish_reason"), items_out, whole.get("usage"))
        await self._keep(request, reply, conversation, items_out, owner)
        return ok(reply)

    async def _conversation(self, request: dict[str, Any],
                            owner: str) -> list[dict[str, Any]]:
        previous = request.get("previous_response_id")
        history: list[dict[str, Any]] = []
        if previous is not None:
            if not isinstance(previous, str):
                raise BadRequest("previous_response_id: a string", "previous_response_id")
            found = await self.store.get(previous, owner)
            if found is None:
                raise BadRequest(f"no stored response {previous!r} (expired, deleted, or "
                                 "made with store: false)", "previous_response_id",
                                 "response_not_found")
            history = found[0]
        return [*history, *items(request.get("input"))]

    async def _keep(self, request: dict[str, Any], reply: dict[str, Any],
                    conversation: list[dict[str, Any]], items_out: list[dict[str, Any]],
                    owner: str) -> None:
        if request.get("store", True) is not False:
            await self.store.put(reply, [*conversation, *_stored_items(items_out)], owner)

    async def _stream(self, request: dict[str, Any], conversation: list[dict[str, Any]],
                      chunks: AsyncIterator[bytes], response_id: str, created: int,
                      model: str, owner: str) -> AsyncIterator[bytes]:
        state = _Stream()
        state.model = model
        started = response(request, response_id, created, model, None, [], None)
        started["status"] = "in_progress"
        yield state.event("response.created", response=started)
        yield state.event("response.in_progress", response=started)
        parser = SSEParser()
        async for part in chunks:
            for data in parser.feed(part):
                if data == "[DONE]":
                    continue
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue  # not a chunk: what else a provider may send
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk:
                    failed = {**started, "status": "failed", "error": {
                        "code": "server_error", "message": str(chunk["error"])}}
                    yield state.event("response.failed", response=failed)
                    return
                for out in state.chunk(chunk):
                    yield out
        for out in state._close():
            yield out
        reply = response(request, response_id, created, state.model, state.finish,
                         state.items, state.usage)
        await self._keep(request, reply, conversation, state.items, owner)
        kind = "response.completed" if reply["status"] == "completed" else \
            "response.incomplete"
        yield state.event(kind, response=reply)
