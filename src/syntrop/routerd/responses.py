"""OpenAI's Responses API (POST /v1/responses), stateful, over routerd's chat
path; GET and DELETE /v1/responses/{id}.

A request's `input` (a string, or message, function_call and
function_call_output items) is appended to the conversation of
`previous_response_id`, if any, and asked as one chat completion: routed
like any other, so the same providers, affinity (a continued conversation
shares its prefix, so it goes where that prefix is warm), limits and
failover. The answer becomes output items (reasoning, message,
function_call) and, unless `store` is false, the response and its
conversation are kept in routerd's state directory (responses.sqlite), so a
later request continues it by id. `instructions` are the request's own (as
OpenAI's API has it, they do not carry over to a continuation). Kept: at most
MAX_STORED responses, MAX_PER_OWNER of one caller's, each at most TTL
seconds; the oldest go first.

What is stored is what the model is sent: items in the shapes `messages`
reads (a message's text parts joined, no ids or statuses), reasoning items
not at all. Each response's row holds only the items it added and points at
the response it continued, so a conversation's history is stored once, not
once per turn; reading a response walks the chain back. A response that is
deleted or dropped while a later one continues it keeps its items (not its
response) until no kept response needs them. A stored conversation is at
most MAX_CONVERSATION_ITEMS items and MAX_CONVERSATION_BYTES bytes: a
request that would take it past either is refused (400) before the model is
asked (one answer's items may still go past it; the next request is refused).

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
from typing import Any, NamedTuple

from syntrop.routerd.api import BadRequest, Response, error, ok, parse
from syntrop.routerd.sse import SSEParser

#: Most responses kept; the oldest go first.
MAX_STORED = 10_000
#: Most responses kept of one caller (owner); their oldest go first.
MAX_PER_OWNER = 1_000
#: Most items in a stored conversation.
MAX_CONVERSATION_ITEMS = 256
#: Most bytes a stored conversation takes: its items and its responses' JSON.
MAX_CONVERSATION_BYTES = 1 << 20
#: Seconds a stored response is kept (30 days).
TTL = 30 * 86400
MIGRATIONS = ("CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, "
              "conversation TEXT NOT NULL, response TEXT NOT NULL);"
              "CREATE INDEX responses_created ON responses (created)",
              # Whose it is: the API key that made it, as http.py names it.
              "ALTER TABLE responses ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
              # A chain: each row holds the items it added (`items`) after
              # those of `previous`; `count` and `bytes` are the
              # conversation's up to it; `visible` is 0 for a response
              # deleted or dropped, kept for the items a later one needs.
              # Rows from before hold their whole conversation, as roots.
              "ALTER TABLE responses RENAME COLUMN conversation TO items;"
              "ALTER TABLE responses ADD COLUMN previous TEXT;"
              "ALTER TABLE responses ADD COLUMN count INTEGER NOT NULL DEFAULT 0;"
              "ALTER TABLE responses ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;"
              "ALTER TABLE responses ADD COLUMN visible INTEGER NOT NULL DEFAULT 1;"
              "UPDATE responses SET count = json_array_length(items), "
              "bytes = length(items) + length(response);"
              "DROP INDEX responses_created;"
              "CREATE INDEX responses_kept ON responses (visible, created);"
              "CREATE INDEX responses_owner ON responses (owner, visible, created);"
              "CREATE INDEX responses_previous ON responses (previous);"
              "CREATE INDEX responses_gone ON responses (id) WHERE visible = 0")
_TEXT_PARTS = ("input_text", "output_text", "text")

Chat = Callable[[bytes], Awaitable[Response]]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class Stored(NamedTuple):
    """A stored response: its conversation rebuilt, the response, and the
    conversation's stored bytes (`size`)."""
    conversation: list[dict[str, Any]]
    response: dict[str, Any]
    size: int


def _drop_unneeded(c: sqlite3.Connection) -> None:
    """Rows of responses no longer kept that no row continues, until none."""
    while c.execute("DELETE FROM responses WHERE visible = 0 AND NOT EXISTS (SELECT 1 "
                    "FROM responses AS later WHERE later.previous = responses.id)"
                    ).rowcount:
        pass


_FORGET = "UPDATE responses SET visible = 0, response = '' WHERE "


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

    async def get(self, response_id: str, owner: str = "") -> Stored | None:
        def read(c: sqlite3.Connection) -> tuple[str, int, list[str]] | None:
            row = c.execute("SELECT response, bytes FROM responses WHERE id = ? AND "
                            "owner = ? AND visible = 1 AND created > ?",
                            (response_id, owner, time.time() - TTL)).fetchone()
            if row is None:
                return None
            # Each response adds an item at least (a row from before holds
            # its whole conversation): the depth bound only stops a loop.
            chain = c.execute(
                "WITH RECURSIVE chain(previous, items, depth) AS ("
                "SELECT previous, items, 0 FROM responses WHERE id = ? UNION ALL "
                "SELECT r.previous, r.items, chain.depth + 1 FROM responses AS r "
                "JOIN chain ON r.id = chain.previous WHERE chain.depth < ?) "
                "SELECT items FROM chain ORDER BY depth DESC",
                (response_id, MAX_CONVERSATION_ITEMS * 2)).fetchall()
            return row[0], row[1], [part for part, in chain]

        found = await self._db().run(read)
        if found is None:
            return None
        conversation = [item for part in found[2] for item in json.loads(part)]
        return Stored(conversation, json.loads(found[0]), found[1])

    async def put(self, response: dict[str, Any], conversation: list[dict[str, Any]],
                  owner: str = "", previous: str | None = None) -> None:
        """Keep `response`, the answer to `conversation`: the items it adds
        to that of `previous` (all of them where that one is gone)."""
        def write(c: sqlite3.Connection) -> None:
            row = None if previous is None else c.execute(
                "SELECT count, bytes FROM responses WHERE id = ? AND owner = ?",
                (previous, owner)).fetchone()
            start, before = (0, 0) if row is None else (row[0], row[1])
            items, text = _json(conversation[start:]), _json(response)
            c.execute("INSERT OR REPLACE INTO responses (id, created, items, response, "
                      "owner, previous, count, bytes, visible) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
                      (response["id"], time.time(), items, text, owner,
                       None if row is None else previous, len(conversation),
                       before + len(items) + len(text)))
            c.execute(_FORGET + "visible = 1 AND created <= ?", (time.time() - TTL,))
            c.execute(_FORGET + "id IN (SELECT id FROM responses WHERE visible = 1 AND "
                      "owner = ? ORDER BY created DESC LIMIT -1 OFFSET ?)",
                      (owner, MAX_PER_OWNER))
            c.execute(_FORGET + "id IN (SELECT id FROM responses WHERE visible = 1 "
                      "ORDER BY created DESC LIMIT -1 OFFSET ?)", (MAX_STORED,))
            _drop_unneeded(c)

        await self._db().run(write)

    async def delete(self, response_id: str, owner: str = "") -> bool:
        def remove(c: sqlite3.Connection) -> bool:
            found = c.execute(_FORGET + "id = ? AND owner = ? AND visible = 1",
                              (response_id, owner)).rowcount > 0
            _drop_unneeded(c)
            return found

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


def stored(item: dict[str, Any], where: str) -> dict[str, Any] | None:
    """An item as it is stored: only what the model is sent (None for a
    reasoning item, which is not fed back)."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest(f"{where}.role: user, assistant, system or developer",
                             f"{where}.role")
        return {"type": "message", "role": role,
                "content": _content_text(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            raise BadRequest(f"{where}: call_id, name and arguments (strings)", where)
        return {k: item[k] for k in ("type", "call_id", "name", "arguments")}
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
            raise BadRequest(f"{where}: call_id and output (strings)", where)
        return {k: item[k] for k in ("type", "call_id", "output")}
    if kind == "reasoning":
        return None
    raise BadRequest(f"{where}: items of type {kind!r} are not supported (message, "
                     "function_call, function_call_output and reasoning are)", where)


def messages(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's items as chat messages; consecutive function calls
    become one assistant message's tool calls."""
    out: list[dict[str, Any]] = []
    for index, raw in enumerate(conversation):
        item = stored(raw, f"input[{index}]")
        if item is None:
            continue
        if item["type"] == "message":
            role = item["role"]
            out.append({"role": "system" if role == "developer" else role,
                        "content": item["content"]})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": item["output"]})
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


def _check_caps(request: dict[str, Any], history: Stored | None,
                conversation: list[dict[str, Any]], added: list[dict[str, Any]]) -> None:
    """A 400 where keeping the answer to `request` would take its stored
    conversation past MAX_CONVERSATION_ITEMS or MAX_CONVERSATION_BYTES."""
    if len(conversation) > MAX_CONVERSATION_ITEMS:
        raise BadRequest(f"the stored conversation would hold {len(conversation)} items, over "
                         f"the cap of {MAX_CONVERSATION_ITEMS} items a conversation: start "
                         "another, or send store: false", "input", "conversation_too_large")
    unanswered = response(request, "", 0, "", None, [], None)
    size = (history.size if history else 0) + len(_json(added)) + len(_json(unanswered))
    if size > MAX_CONVERSATION_BYTES:
        raise BadRequest(f"the stored conversation would take {size} bytes, over the cap of "
                         f"{MAX_CONVERSATION_BYTES} bytes a conversation: start another, or "
                         "send store: false", "input", "conversation_too_large")


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
        """The conversation to ask: the history of `previous_response_id`
        and the input, as they are stored (see the module)."""
        previous = request.get("previous_response_id")
        found = None
        if previous is not None:
            if not isinstance(previous, str):
                raise BadRequest("previous_response_id: a string", "previous_response_id")
            found = await self.store.get(previous, owner)
            if found is None:
                raise BadRequest(f"no stored response {previous!r} (expired, deleted, or "
                                 "made with store: false)", "previous_response_id",
                                 "response_not_found")
        added = [kept for index, item in enumerate(items(request.get("input")))
                 if (kept := stored(item, f"input[{index}]")) is not None]
        if not added:  # each stored response adds an item: its chain is that short
            raise BadRequest("input: an item the model is sent (reasoning items are not)",
                             "input")
        conversation = [*(found.conversation if found else []), *added]
        if request.get("store", True) is not False:
            _check_caps(request, found, conversation, added)
        return conversation

    async def _keep(self, request: dict[str, Any], reply: dict[str, Any],
                    conversation: list[dict[str, Any]], items_out: list[dict[str, Any]],
                    owner: str) -> None:
        if request.get("store", True) is not False:
            await self.store.put(reply, [*conversation, *_stored_items(items_out)], owner,
                                 request.get("previous_response_id"))

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
