"""OpenAI function calling on runtimed: tools, tool_choice, tool messages.

runtimed's models differ in how (and whether) their chat templates mark a
tool call, but every one of them can be made to write JSON under a schema.
So a request with tools is decoded under a schema built from the declared
tools, and the reply is one JSON object:

    {"tool_calls": [{"name": NAME, "arguments": {...}}, ...]}   calls
    {"content": "..."}                                         an answer

tool_choice picks the schema: "required" (or a named function) allows only
calls (of that function), "auto" either form, "none" no tools at all. The
arguments of each call are decoded under that function's own parameters
schema, so they always validate. The declared tools are described to the
model in a system message; the conversation's earlier calls and the tool
results sent back are rewritten into the same JSON and into user turns, as
runtimed's templates take only system, user and assistant turns.

Pure: no I/O. `ToolStream` turns the streamed JSON into OpenAI's deltas.
"""

import json
import os
import re
from dataclasses import dataclass
from typing import Any

#: Most calls in one reply (parallel tool calls).
MAX_CALLS = 4


class ToolsError(ValueError):
    """A request's tools, tool_choice or messages are malformed; `param`
    names which."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Plan:
    """How one request with tools is decoded."""

    functions: tuple[Function, ...]
    #: "auto", "required", or the one function's name.
    choice: str
    #: The JSON Schema of the reply.
    schema: dict[str, Any]
    #: Whether an answer's content is JSON under response_format (it is
    #: then the JSON text of that value).
    json_content: bool


def _functions(tools: Any) -> tuple[Function, ...]:
    if not isinstance(tools, list) or not tools:
        raise ToolsError("tools must be a non-empty list of function tools", "tools")
    found: list[Function] = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or \
                not isinstance(function, dict):
            raise ToolsError(f"{where} must be {{\"type\": \"function\", \"function\": ...}}",
                             "tools")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ToolsError(f"{where}.function.name must be 1 to 64 letters, digits, _ or -",
                             "tools")
        if any(f.name == name for f in found):
            raise ToolsError(f"{where}: the function {name!r} is declared twice", "tools")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ToolsError(f"{where}.function.parameters must be a JSON Schema object",
                             "tools")
        description = function.get("description", "")
        found.append(Function(name, description if isinstance(description, str) else "",
                              parameters))
    return tuple(found)


def _choice(value: Any, functions: tuple[Function, ...]) -> str:
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return str(value)
    name = value.get("function", {}).get("name") if isinstance(value, dict) else None
    if not isinstance(name, str) or value.get("type") != "function":
        raise ToolsError('tool_choice must be "auto", "none", "required" or '
                         '{"type": "function", "function": {"name": ...}}', "tool_choice")
    if not any(f.name == name for f in functions):
        raise ToolsError(f"tool_choice names {name!r}, which tools does not declare",
                         "tool_choice")
    return name


def _calls_schema(functions: tuple[Function, ...], most: int) -> dict[str, Any]:
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": f.name}, "arguments": f.parameters}}
             for f in functions]
    return {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
            "properties": {"tool_calls": {
                "type": "array", "minItems": 1, "maxItems": most,
                "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}}}


def plan(body: dict[str, Any], content_schema: dict[str, Any] | None = None) -> Plan | None:
    """The plan of a chat request, or None when it has no tools (or
    tool_choice is "none"). `content_schema`: response_format's schema,
    which an answer's content must then follow. ToolsError when malformed."""
    if body.get("tools") is None:
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise ToolsError("tool_choice without tools", "tool_choice")
        return None
    functions = _functions(body["tools"])
    choice = _choice(body.get("tool_choice"), functions)
    if choice == "none":
        return None
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ToolsError("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if choice not in ("auto", "required"):
        functions = tuple(f for f in functions if f.name == choice)
    calls = _calls_schema(functions, MAX_CALLS if parallel and choice in ("auto", "required")
                          else 1)
    if choice != "auto":
        return Plan(functions, choice, calls, False)
    answer = {"type": "object", "additionalProperties": False, "required": ["content"],
              "properties": {"content": content_schema or {"type": "string"}}}
    return Plan(functions, choice, {"anyOf": [calls, answer]}, content_schema is not None)


def instructions(plan: Plan) -> str:
    """The system text that tells the model its tools and the reply's form."""
    lines = ["You can call functions. Reply with one JSON object:",
             '{"tool_calls": [{"name": <function>, "arguments": {...}}]} to call functions'
             + (',\nor {"content": <your answer>} to answer directly.' if plan.choice == "auto"
                else "."),
             "Functions:"]
    for function in plan.functions:
        lines.append(f"- {function.name}: {function.description or '(no description)'} "
                     f"Parameters: {json.dumps(function.parameters, separators=(',', ':'))}")
    return "\n".join(lines)


def _text(content: Any, index: int = 0) -> str:
    """A message's text; content parts other than text (images, audio) are
    refused: runtimed's models read text only, and dropping them silently
    would answer a question nobody asked."""
    if isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ToolsError(f"messages[{index}]: runtimed reads text only; a "
                                 f"{kind or 'non-object'} content part is not supported",
                                 "messages")
        return "".join(str(part.get("text", "")) for part in content)
    return content if isinstance(content, str) else ""


def messages(body: dict[str, Any], plan: Plan | None) -> list[tuple[str, str]]:
    """The conversation as (role, text) turns runtimed takes: the tools'
    instructions in the (first) system turn, an assistant's earlier calls as
    the JSON the model writes, each tool result as a user turn naming the
    call it answers. Other roles pass unchanged (runtimed judges them)."""
    names: dict[str, str] = {}
    turns: list[tuple[str, str]] = []
    for index, message in enumerate(body["messages"]):
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call.get("function", {}) if isinstance(call, dict) else {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except (TypeError, ValueError):
                    raise ToolsError(f"messages[{index}].tool_calls: arguments must be JSON "
                                     "text", "messages") from None
                names[str(call.get("id"))] = str(function.get("name"))
                calls.append({"name": function.get("name"), "arguments": arguments})
            turns.append(("assistant", json.dumps({"tool_calls": calls})))
        elif role == "tool":
            ident = message.get("tool_call_id")
            if not isinstance(ident, str):
                raise ToolsError(f"messages[{index}]: a tool message needs tool_call_id",
                                 "messages")
            named = f" ({names[ident]})" if ident in names else ""
            turns.append(("user", f"Result of function call {ident}{named}:\n"
                                  f"{_text(message.get('content'), index)}"))
        elif role == "developer":  # OpenAI's newer name for system
            turns.append(("system", _text(message.get("content"), index)))
        else:
            turns.append((str(role), _text(message.get("content"), index)))
    if plan is not None:
        told = instructions(plan)
        first = next((i for i, (role, _) in enumerate(turns) if role == "system"), None)
        if first is None:
            turns.insert(0, ("system", told))
        else:
            turns[first] = ("system", f"{turns[first][1]}\n\n{told}")
    return turns


def _call(call: dict[str, Any]) -> dict[str, Any]:
    return {"id": "call_" + os.urandom(12).hex(), "type": "function",
            "function": {"name": call["name"],
                         "arguments": json.dumps(call["arguments"], separators=(",", ":"))}}


def reply(text: str, plan: Plan, finish: str) -> tuple[dict[str, Any], str]:
    """The assistant message and finish_reason of a whole reply. A reply
    cut short (finish "length": max_tokens ended it mid-JSON) keeps what it
    answered: an answer's text so far (its JSON string decoded), a JSON
    answer's JSON so far; a call cut short is no call and no content,
    never raw JSON shown as the answer."""
    try:
        value = json.loads(text)
    except ValueError:
        if (answer := _ANSWER.match(text)) is not None:
            return {"role": "assistant", "content": _string_prefix(text[answer.end():])[0]}, \
                finish
        if (shaped := _JSON_ANSWER.match(text)) is not None and plan.json_content:
            return {"role": "assistant", "content": text[shaped.end():]}, finish
        if text.lstrip().startswith("{"):
            return {"role": "assistant", "content": None}, finish
        return {"role": "assistant", "content": text}, finish
    if isinstance(value, dict) and "tool_calls" in value:
        return ({"role": "assistant", "content": None,
                 "tool_calls": [_call(call) for call in value["tool_calls"]]}, "tool_calls")
    content = value.get("content") if isinstance(value, dict) else text
    if plan.json_content:
        content = json.dumps(content)
    return {"role": "assistant", "content": content}, finish


_ANSWER = re.compile(r'\s*\{\s*"content"\s*:\s*"')
_JSON_ANSWER = re.compile(r'\s*\{\s*"content"\s*:\s*')


def _string_prefix(text: str) -> tuple[str, bool]:
    """The decoded part of a JSON string body that is complete (an escape
    cut in half waits), and whether the closing quote was reached."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == '"':
            return "".join(out), True
        if char != "\\":
            out.append(char)
            index += 1
            continue
        width = 6 if text[index + 1:index + 2] == "u" else 2
        if index + width > len(text):
            break
        if width == 6 and 0xD800 <= int(text[index + 2:index + 6], 16) <= 0xDBFF:
            if index + 12 > len(text):  # a surrogate pair: wait for its second half
                break
            width = 12
        out.append(json.loads(f'"{text[index:index + width]}"'))
        index += width
    return "".join(out), False


class ToolStream:
    """A streamed reply under a Plan, as OpenAI deltas. An answer streams as
    it is written (its JSON string decoded on the fly); calls go out once
    the reply is complete, one delta per call, as OpenAI's parsers expect."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = ""

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """Deltas to send for the reply so far."""
        self.text += piece
        if self.plan.json_content:
            return []  # JSON content: whole, at the end
        match = _ANSWER.match(self.text)
        if match is None:
            return []
        decoded, _ = _string_prefix(self.text[match.end():])
        fresh, self.sent = decoded[len(self.sent):], decoded
        return [{"content": fresh}] if fresh else []

    def finish(self, finish: str) -> tuple[list[dict[str, Any]], str]:
        """The last deltas and the finish_reason."""
        message, reason = reply(self.text, self.plan, finish)
        if "tool_calls" in message:
            return [{"tool_calls": [{"index": index, **call}]}
                    for index, call in enumerate(message["tool_calls"])], reason
        content = message["content"] or ""
        rest = content[len(self.sent):] if content.startswith(self.sent) else content
        return ([{"content": rest}] if rest else []), reason
