"""The face ↔ worker messages: the one module both sides import for them.

The face (service.py, supervisor.py) sends a worker a `Request` (an id and
one `Operation`: `Load`, `Generate`, `Decode`, `Open`, `Save`, ... each a
frozen dataclass of typed fields), `Cancel` and `Exit`; the worker answers
each request with `Piece`s (a stream's text, as `piece` or `think`) and then
`Done` with its result or `Failed`, and says `Fatal` once when its engine
cannot start. A declared failure is a `Kind` and its parameters, raised in
the worker as `WorkerError`; the face raises the Runtime1 error
supervisor.ERRORS maps the kind to, so the worker never sees a Varlink
error class.

`encode` turns a message into the dict that channel.py carries (JSON,
descriptors beside it: an operation as {"op": name, "args": its fields})
and `decode` turns such a dict back into typed messages. A worker's
settings travel in its environment (`Settings`, as JSON). A reply's result
stays a dict, each operation's keys host.py's and the face's to agree on.
"""

import enum
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from syntrop.runtimed.sampling import Params

if TYPE_CHECKING:
    from syntrop.runtimed.constrain import Constraint

#: The rate of every speech packet (Runtime1.Speak; speech.py makes them).
SPEECH_RATE = 24_000

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Placed:
    """Where a model's engine runs, as the face placed it from the model's
    lease (placement.py) and sends it with `load`: llama.cpp's device
    settings, the most threads a context takes (0: no cap beyond the cores
    free at its load) and the CPUs the worker is pinned to (None: not
    pinned), and why, in a line."""

    n_gpu_layers: int = 0
    #: llama.cpp's enum llama_split_mode: 0 none, 1 layer, 2 row.
    split_mode: int = 0
    main_gpu: int = 0
    #: Shares per device number (None: one device or none).
    tensor_split: tuple[float, ...] | None = None
    n_threads: int = 0
    cpu_affinity: tuple[int, ...] | None = None
    why: str = ""

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> "Placed":
        split, affinity = value.get("tensor_split"), value.get("cpu_affinity")
        return cls(**{**value, "tensor_split": None if split is None else tuple(split),
                      "cpu_affinity": None if affinity is None else tuple(affinity)})

    def llama_kwargs(self, threads: int) -> dict[str, Any]:
        """Keyword arguments of llama_cpp.Llama for a context of `threads`
        threads (the placement's cap applied)."""
        if self.n_threads:
            threads = min(threads, self.n_threads)
        kwargs: dict[str, Any] = {"n_gpu_layers": self.n_gpu_layers,
                                  "split_mode": self.split_mode, "main_gpu": self.main_gpu,
                                  "n_threads": threads, "n_threads_batch": threads}
        if self.tensor_split is not None:
            kwargs["tensor_split"] = list(self.tensor_split)
        return kwargs


# face -> worker


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """Say who you are: pid, engine, llama.cpp's system info."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """Load the model whose descriptor rides beside (a GGUF model or a
    voice), placed as the face placed it."""

    name: str
    digest: str = ""
    placement: Placed | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Draft:
    """Load the draft model whose descriptor rides beside."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Speculation:
    """Speculative decoding: a draft model's name (None: prompt lookup) and
    the most tokens drafted a step (None: the worker's default)."""

    draft: str | None = None
    draft_max: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decoding:
    """How a stream decodes: the sampling, the constraint the face
    compiled, and speculation."""

    params: Params
    constraint: "Constraint | None" = None
    speculative: Speculation | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """A completion's `text`, or a chat's `messages` (role, content), the
    last one left open with `continue_last`."""

    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    continue_last: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Generate:
    """A stateless stream; a prefill handed in (handoff.py) may ride
    beside, checked against the model's `digest`."""

    prompt: Prompt
    options: Options
    decoding: Decoding
    digest: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decode:
    """A stream that continues session `session`."""

    session: str
    decoding: Decoding


@dataclass(frozen=True, slots=True, kw_only=True)
class Embed:
    options: Options
    input: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Export:
    """Prefill `messages` and hand back the state (Runtime1.Prefill)."""

    options: Options
    messages: tuple[tuple[str, str], ...]
    digest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Open:
    """Open session `session`'s context; a LoRA adapter's descriptor may
    ride beside."""

    session: str
    options: Options
    lora: str | None = None
    lora_scale: float = 1.0
    sinks: int | None = None
    prompt_format: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Prefix:
    """Make a session's context start with `text` (manifest `digest`)."""

    session: str
    text: str
    add_bos: bool
    current_digest: str | None
    digest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Suffix:
    """Evaluate `text` after a session's `prefix_tokens`."""

    session: str
    text: str
    prefix_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Save:
    """Spill a session: its state comes back beside the reply."""

    session: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Restore:
    """Bring a spilled session back; its state rides beside."""

    session: str
    lora: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Close:
    session: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Trim:
    """Free the idle contexts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Speak:
    model: str
    text: str
    voice: str | None = None
    speed: float | None = None


Operation = (Hello | Load | Draft | Generate | Decode | Embed | Export | Open | Prefix
             | Suffix | Save | Restore | Close | Trim | Speak)
#: Each operation's name on the wire.
OPERATIONS: dict[str, type[Operation]] = {
    "hello": Hello, "load": Load, "draft": Draft, "generate": Generate, "decode": Decode,
    "embed": Embed, "export": Export, "open": Open, "prefix": Prefix, "suffix": Suffix,
    "save": Save, "restore": Restore, "close": Close, "trim": Trim, "speak": Speak}
NAMES = {cls: name for name, cls in OPERATIONS.items()}


def _turns(value: list[list[str]]) -> tuple[tuple[str, str], ...]:
    return tuple((str(role), str(text)) for role, text in value)


def _decoding(value: dict[str, Any]) -> Decoding:
    from syntrop.runtimed.constrain import Constraint

    params, constraint, spec = value["params"], value["constraint"], value["speculative"]
    return Decoding(params=Params(**{**params, "stop": tuple(params["stop"])}),
                    constraint=None if constraint is None else Constraint(**constraint),
                    speculative=None if spec is None else Speculation(**spec))


#: How a field's JSON value becomes its type (the others are JSON already).
_FIELDS: dict[str, Callable[[Any], Any]] = {
    "placement": Placed.from_wire,
    "options": lambda value: Options(**value),
    "decoding": _decoding,
    "prompt": lambda value: Prompt(text=value["text"], continue_last=value["continue_last"],
                                   messages=value["messages"] and _turns(value["messages"])),
    "messages": _turns,
    "input": lambda value: tuple(str(text) for text in value),
}


def operation(op: str, args: dict[str, Any]) -> Operation:
    """The operation `op` with its wire `args` (ValueError: no such op)."""
    cls = OPERATIONS.get(op)
    if cls is None:
        raise ValueError(f"unknown operation {op!r}")
    return cls(**{name: value if value is None or name not in _FIELDS else _FIELDS[name](value)
                  for name, value in args.items()})


@dataclass(frozen=True, slots=True)
class Request:
    """Run `operation` (descriptors ride beside it)."""

    id: int
    operation: Operation

    @property
    def op(self) -> str:
        return NAMES[type(self.operation)]


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
    carries the first token's times (received, started, at) once. A
    speech stream's `kind` is "audio": `text` is a packet's PCM in base64
    and `tokens` the index of its sentence."""

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


class Kind(enum.Enum):
    """What a worker's declared failure is. Its parameters are named in the
    comment beside it; the face raises the Runtime1 error that
    supervisor.ERRORS maps it to, with those parameters."""

    OVERFLOW = "overflow"  # tokens, n_ctx
    INVALID_MODEL = "invalid_model"  # model, reason
    INVALID_PARAMETER = "invalid_parameter"  # parameter
    INVALID_SAMPLING = "invalid_sampling"  # parameter, reason
    CONSTRAINT = "constraint"  # reason, message
    SESSION_MISSING = "session_missing"  # session_id
    SHIFT_UNSUPPORTED = "shift_unsupported"  # model
    VOCABULARY_MISMATCH = "vocabulary_mismatch"  # draft, reason
    ADAPTER_MISMATCH = "adapter_mismatch"  # adapter, reason
    NOT_A_VOICE = "not_a_voice"  # model


class WorkerError(Exception):
    """A declared failure, raised inside the worker: the loop answers it
    with `Failed(kind, parameters)`."""

    def __init__(self, kind: Kind, **parameters: Any) -> None:
        super().__init__(kind.value, parameters)
        self.kind = kind
        self.parameters = parameters


@dataclass(frozen=True, slots=True)
class Failed:
    """Request `id` failed: a declared failure (its `kind` and
    `parameters`), or, with no kind, anything else in words."""

    id: int
    kind: Kind | None
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
        case Request(id=rid, operation=operation):
            wire = {"id": rid, "op": message.op, "args": asdict(operation)}
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
        case Failed(id=rid, kind=None, message=text):
            wire = {"id": rid, "event": "error", "error": {"kind": None, "message": text}}
        case Failed(id=rid, kind=Kind(value=kind), parameters=parameters):
            wire = {"id": rid, "event": "error",
                    "error": {"kind": kind, "parameters": parameters}}
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
        return Request(rid, operation(op, dict(wire.get("args") or {})))
    event = str(wire.get("event", ""))
    if event in ("piece", "think", "audio"):
        return Piece(rid, event, str(wire.get("text", "")), int(wire.get("tokens", 0)),
                     wire.get("logprobs"), first)
    if event == "done":
        return Done(rid, dict(wire.get("result") or {}), first)
    if event == "error":
        error = dict(wire.get("error") or {})
        kinds = {kind.value: kind for kind in Kind}
        return Failed(rid, kinds.get(str(error.get("kind"))), dict(error.get("parameters") or {}),
                      str(error.get("message", "the engine failed")), first)
    if event == "fatal":
        return Fatal(str(wire.get("message", "")))
    raise ValueError(f"not a message: {event!r}")
