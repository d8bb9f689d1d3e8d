"""The face ↔ worker messages: the one module both sides import for them.

The face (service.py, supervisor.py) sends a worker `Request`, `Cancel` and
`Exit`; the worker answers each request with `Piece`s (a stream's text, as
`piece` or `think`) and then `Done` or `Failed`, and says `Fatal` once when
its engine cannot start. `encode` turns a message into the dict that
channel.py carries (JSON, descriptors beside it) and `decode` turns such a
dict back; the dicts are the wire, unchanged. A worker's settings travel in
its environment (`Settings`, as JSON), and a context's `Options` and the
sampling (`wire_params`) inside a request's arguments.

A request's arguments and a reply's result stay dicts: each operation's
fields are the worker's host.py and the face's to agree on.
"""

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from syntrop.runtimed.sampling import Params

#: KV-cache element types (ggml type ids); the quantised ones need flash
#: attention in llama.cpp.
KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How to create a context; every field maps to a llama.cpp parameter."""

    n_ctx: int = 2048
    n_batch: int = 512
    n_threads: int = 0
    n_gpu_layers: int = 0
    flash_attn: bool = False
    embedding: bool = False
    kv_cache_type: str = "f16"


def wire_params(params: "Params") -> dict[str, Any]:
    """Sampling parameters as a request's `params`."""
    return {**asdict(params), "stop": list(params.stop)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """A worker's settings (its environment's SYNTROP_WORKER): the model,
    runtimed's pid, the layout, slots, threads and instances, the pace
    board's descriptor and cell, and its niceness."""

    model: str
    parent: int
    layout: str
    slots: int
    cpus: int
    instances: int
    board: int
    cell: int
    nice: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Settings":
        return cls(**json.loads(text))


# face -> worker


@dataclass(frozen=True, slots=True)
class Request:
    """Run `op` with `args` (descriptors ride beside it)."""

    id: int
    op: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop the stream of request `id`."""

    id: int


@dataclass(frozen=True, slots=True)
class Exit:
    """Finish: the worker returns from its loop and exits."""


# worker -> face


@dataclass(frozen=True, slots=True)
class Piece:
    """A stream's text: `kind` is "piece" (the answer) or "think"; `first`
    carries the first token's times (received, started, at) once."""

    id: int
    kind: str
    text: str
    tokens: int
    logprobs: list[dict[str, Any]] | None = None
    first: dict[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """Request `id` is over: its result."""

    id: int
    result: dict[str, Any]
    first: dict[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """Request `id` failed: a declared Runtime1 error (`name` and its
    `parameters`), or, with no name, anything else in words."""

    id: int
    name: str | None
    parameters: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    first: dict[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Fatal:
    """The worker cannot start its engine."""

    message: str


Message = Request | Cancel | Exit | Piece | Done | Failed | Fatal
#: What a worker sends about a request.
Reply = Piece | Done | Failed


def encode(message: Message) -> dict[str, Any]:
    """`message` as channel.py carries it."""
    wire: dict[str, Any]
    match message:
        case Request(id=rid, op=op, args=args):
            wire = {"id": rid, "op": op, "args": args}
        case Cancel(id=rid):
            wire = {"id": rid, "op": "cancel"}
        case Exit():
            wire = {"id": 0, "op": "exit"}
        case Piece():
            wire = {"id": message.id, "event": message.kind, "text": message.text,
                    "tokens": message.tokens}
            if message.logprobs is not None:
                wire["logprobs"] = message.logprobs
        case Done(id=rid, result=result):
            wire = {"id": rid, "event": "done", "result": result}
        case Failed(id=rid, name=None, message=text):
            wire = {"id": rid, "event": "error", "error": {"name": None, "message": text}}
        case Failed(id=rid, name=name, parameters=parameters):
            wire = {"id": rid, "event": "error",
                    "error": {"name": name, "parameters": parameters}}
        case Fatal(message=text):
            wire = {"id": 0, "event": "fatal", "message": text}
    first = getattr(message, "first", None)
    if first is not None:
        wire["first"] = first
    return wire


def decode(wire: dict[str, Any]) -> Message:
    """The message a dict from channel.py stands for (ValueError when it
    stands for none)."""
    raw = wire.get("id", 0)
    rid = raw if isinstance(raw, int) and not isinstance(raw, bool) else -1
    first = wire.get("first")
    if "event" not in wire:
        op = str(wire.get("op", ""))
        if op == "cancel":
            return Cancel(rid)
        if op == "exit":
            return Exit()
        return Request(rid, op, dict(wire.get("args") or {}))
    event = str(wire.get("event", ""))
    if event in ("piece", "think"):
        return Piece(rid, event, str(wire.get("text", "")), int(wire.get("tokens", 0)),
                     wire.get("logprobs"), first)
    if event == "done":
        return Done(rid, dict(wire.get("result") or {}), first)
    if event == "error":
        error = dict(wire.get("error") or {})
        name = error.get("name")
        return Failed(rid, str(name) if name else None, dict(error.get("parameters") or {}),
                      str(error.get("message", "the engine failed")), first)
    if event == "fatal":
        return Fatal(str(wire.get("message", "")))
    raise ValueError(f"not a message: {event!r}")
