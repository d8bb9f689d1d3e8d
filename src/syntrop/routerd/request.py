"""An OpenAI request as routerd reads it: parsed once, at the HTTP edge
(`read`: api.py's parse and check, the same 400s), into a frozen Request
that the gateway, routing, the relay and the providers read instead of
each reading the body again. The body is kept as the client sent it for
the providers that pass it on (OpenAI-compatible remotes and peers:
`sent`); what runtimed is asked (Runtime1.Chat: providers/runtimed.py)
comes from the record's fields."""

import dataclasses
from dataclasses import dataclass
from typing import Any

from syntrop.routerd import tools
from syntrop.routerd.api import check, parse, prompt_tokens

#: The forwarded request's field naming the helper of a hand-off planned
#: for the member it is sent to: {"from": node id} (handoff.py). Only
#: another node's is heeded (`Request.handoff`); routerd passes its own
#: beside the request (providers/base.py's Handed), never in it.
HANDOFF = "syntrop_handoff"

Turns = tuple[tuple[str, str], ...]


def response_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's response_format as a JSON Schema: json_object is any JSON
    object, json_schema its schema (always strict: the output is decoded
    under the schema, so it validates); text or none, None."""
    value = body.get("response_format")
    if not isinstance(value, dict):
        return None
    if value.get("type") == "json_object":
        return {"type": "object"}
    if value.get("type") == "json_schema":
        schema: dict[str, Any] = value.get("json_schema", {}).get("schema") or {"type": "object"}
        return schema
    return None


def turns(body: dict[str, Any]) -> Turns | None:
    """A chat's messages as runtimed takes them (tools folded in:
    routerd/tools.py); None when they cannot be (runtimed refuses the
    request, saying why)."""
    try:
        return tuple(tools.messages(body, tools.plan(body, response_schema(body))))
    except (tools.ToolsError, KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Request:
    """One checked request: chat/completions, completions or embeddings."""

    endpoint: str
    #: The body as the client sent it, less routerd's own field (HANDOFF).
    body: dict[str, Any]
    #: The model: as asked ("": the default) until a candidate is chosen
    #: (`of`), then that candidate's.
    model: str
    stream: bool
    #: The prompt's size, estimated at four characters a token.
    tokens: int
    #: A chat's turns as runtimed takes them; None for other endpoints, or
    #: when runtimed would refuse them.
    turns: Turns | None
    #: A chat's response_format as a JSON Schema (None: free text).
    response_schema: dict[str, Any] | None
    #: The helper a forwarded chat names (HANDOFF; heeded only from
    #: another node of the fleet).
    handoff: Any = None
    #: An answer continued elsewhere (relay.py): its last turn, the text
    #: already sent, is left open where the provider can.
    continuation: bool = False

    def of(self, model: str) -> "Request":
        """This request as `model` is asked it."""
        return dataclasses.replace(self, model=model)

    def sent(self) -> dict[str, Any]:
        """The body a pass-through provider sends on."""
        return {**self.body, "model": self.model}

    def continued(self, text: str, chunks: int) -> "Request":
        """The request that continues an answer of which `text` went out:
        the prompt replayed with it, the token budget reduced by the chunks
        already sent (about one token each)."""
        if self.endpoint == "completions":
            body = {**self.body, "prompt": self.body["prompt"] + text}
        else:
            body = {**self.body, "messages": [*self.body["messages"],
                                               {"role": "assistant", "content": text}]}
        for name in ("max_tokens", "max_completion_tokens"):
            if body.get(name):
                body[name] = max(1, body[name] - chunks)
        return dataclasses.replace(self, body=body, continuation=self.endpoint != "completions",
                                   turns=turns(body) if self.turns is not None else None)


def read(endpoint: str, raw: bytes) -> Request:
    """`raw` parsed and checked (api.BadRequest, naming the field, when it
    is not a request routerd can route)."""
    body = parse(raw)
    check(endpoint, body)
    handoff = body.pop(HANDOFF, None)
    chat = endpoint == "chat/completions"
    return Request(endpoint=endpoint, body=body, model=body.get("model") or "",
                   stream=bool(body.get("stream")), tokens=prompt_tokens(endpoint, body),
                   turns=turns(body) if chat else None,
                   response_schema=response_schema(body) if chat else None,
                   handoff=handoff)
