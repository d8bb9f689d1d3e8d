"""Constrained decoding: output that parses and validates, by construction.

A `Constraint` is built from a JSON Schema, a regular expression, or a
Varlink method of a syntrop contract (the output is then the JSON call
object `{"method": "io.syntrop.X.Method", "parameters": {...}}` valid against
that method's parameters as the IDL declares them). It is compiled to an
llguidance grammar; `Guide` is a logits processor for llama-cpp-python's
`Llama.generate(..., logits_processor=LogitsProcessorList([guide]))` that
feeds the tokens generated so far to an llguidance matcher, asks it for the
bitmask of allowed next tokens, and sends every other logit to -inf. Once
the grammar is complete only the end-of-sequence token is left, so decoding
stops there.

Bounds: Varlink strings get a maximum length, lists and maps a maximum size,
and numbers a range (JSON Schema `maxLength`, `maxItems`, `maxProperties`,
`minimum`/`maximum`), so every output of the grammar is finite and
`Constraint.max_tokens` is an upper bound on its length in tokens (every
token the grammar allows carries at least one byte). A caller that decodes at
least that many tokens never cuts a value short. JSON is compact (no
whitespace between tokens), and JSON strings never hold raw control
characters, newlines included (llguidance's JSON lexer forbids them).

Errors are `ConstraintError` with a `reason` the service maps to a Varlink
error, raised before any token is generated. llguidance, jsonschema and numpy
are imported when a constraint is built, never at start-up.
"""

import dataclasses
import enum
import json
import types
import typing
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

#: Longest string a Varlink-mode value may have, in characters.
MAX_STRING = 128
#: Most items in a Varlink list or map.
MAX_ITEMS = 8
#: Varlink int range offered to the model (|x| <= 2**53: exact in a double).
INT_RANGE = 2**53
#: Varlink float: range and resolution offered to the model.
FLOAT_RANGE = 1e9
FLOAT_DECIMALS = 6
#: Keys of a map or of a free-form object.
KEY_PATTERN = "^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
KEY_BYTES = 32 + 2
#: How llguidance renders JSON: compact (no whitespace), and no \\uXXXX
#: escapes in strings (the two-character escapes stay), so one character of
#: a string takes at most 4 bytes.
JSON_OPTIONS: "JsonCompileOptions" = {"whitespace_flexible": False,
                                      "json_allowed_escapes": '"\\nrtbf'}
BYTES_PER_CHAR = 4

# Reasons (the service maps them to declared Varlink errors).
INVALID_SCHEMA = "invalid_schema"
INVALID_REGEX = "invalid_regex"
UNKNOWN_INTERFACE = "unknown_interface"
UNKNOWN_METHOD = "unknown_method"
UNSUPPORTED = "unsupported"


class ConstraintError(Exception):
    """A constraint that cannot be built. `reason` is one of INVALID_SCHEMA,
    INVALID_REGEX, UNKNOWN_INTERFACE, UNKNOWN_METHOD, UNSUPPORTED; `message`
    says what is wrong, in words."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Constraint:
    """A compiled constraint.

    kind: json_schema, regex or varlink.
    grammar: the llguidance grammar (its JSON text).
    schema: the JSON Schema, for json_schema and varlink.
    max_tokens: an upper bound on the tokens of any complete output (the
        end-of-sequence token not counted); None when the language is
        unbounded.
    """

    kind: str
    grammar: str
    schema: Mapping[str, Any] | None = None
    max_tokens: int | None = None


def _validate(grammar: str, reason: str) -> None:
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise ConstraintError(reason, error.strip().splitlines()[0])


def from_json_schema(schema: str | Mapping[str, Any]) -> Constraint:
    """A constraint from a JSON Schema (its text or the decoded object)."""
    import jsonschema
    from llguidance import LLMatcher

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as error:
            raise ConstraintError(INVALID_SCHEMA, f"not JSON: {error}") from None
    if not isinstance(schema, Mapping):
        raise ConstraintError(INVALID_SCHEMA, "a schema must be a JSON object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        raise ConstraintError(INVALID_SCHEMA, error.message) from None
    try:
        grammar = LLMatcher.grammar_from_json_schema(dict(schema), overrides=JSON_OPTIONS)
    except (ValueError, RuntimeError) as error:
        raise ConstraintError(INVALID_SCHEMA, str(error)) from None
    _validate(grammar, INVALID_SCHEMA)
    return Constraint(kind="json_schema", grammar=grammar, schema=schema,
                      max_tokens=max_bytes(schema))


def from_regex(pattern: str) -> Constraint:
    """A constraint from a regular expression; the whole output matches it."""
    from llguidance import LLMatcher

    if (len(pattern) - len(pattern.rstrip("\\"))) % 2:
        # llguidance would read the dangling escape as escaping its own
        # closing delimiter and accept an empty regex.
        raise ConstraintError(INVALID_REGEX, "the pattern ends in an unfinished escape")
    grammar = LLMatcher.grammar_from_regex(pattern)
    _validate(grammar, INVALID_REGEX)
    return Constraint(kind="regex", grammar=grammar)


def from_varlink(interface: str, method: str) -> Constraint:
    """A constraint whose outputs are calls of `interface`.`method` (a
    syntrop contract), valid against its parameters."""
    return dataclasses.replace(from_json_schema(call_schema(interface, method)), kind="varlink")


def _multiple_of(validator: Any, step: Any, instance: Any, schema: Any) -> Any:
    """multipleOf in decimal arithmetic: 0.7 is a multiple of 1e-06 (binary
    floating point says it is not)."""
    import decimal

    import jsonschema

    if not validator.is_type(instance, "number"):
        return
    quotient = decimal.Decimal(repr(instance)) / decimal.Decimal(repr(step))
    if quotient != quotient.to_integral_value():
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step!r}")


def check(constraint: Constraint, text: str) -> Any:
    """Parse `text` as strict JSON and validate it against the constraint's
    schema; return the value. Raises ValueError (json.JSONDecodeError) or
    jsonschema.ValidationError. For json_schema and varlink constraints."""
    import jsonschema

    if constraint.schema is None:
        raise ValueError(f"a {constraint.kind} constraint has no schema")
    value = json.loads(text, strict=True)
    base = jsonschema.validators.validator_for(constraint.schema)
    strict = jsonschema.validators.extend(base, {"multipleOf": _multiple_of})
    strict(constraint.schema).validate(value)
    return value


def _contract(interface: str) -> Any:
    from syntrop.interfaces.catalog import ALL

    for contract in ALL:
        if contract.name == interface:
            return contract
    raise ConstraintError(UNKNOWN_INTERFACE, f"no interface {interface}")


def call_schema(interface: str, method: str) -> dict[str, Any]:
    """JSON Schema of a call object of `interface`.`method`."""
    import inspect

    contract = _contract(interface)
    raw = dict(contract.contract_methods()).get(method)
    if raw is None:
        raise ConstraintError(UNKNOWN_METHOD, f"{interface} has no method {method}")
    items = list(inspect.signature(raw).parameters.items())[1:]
    hints = typing.get_type_hints(raw)
    fields = {name: (hints.get(name, Any), p.default is not p.empty) for name, p in items}
    return {
        "type": "object",
        "properties": {
            "method": {"const": f"{interface}.{method}"},
            "parameters": _object(fields, f"{interface}.{method}"),
        },
        "required": ["method", "parameters"],
        "additionalProperties": False,
    }


def _object(fields: Mapping[str, tuple[Any, bool]], where: str) -> dict[str, Any]:
    """Schema of a Varlink struct: (annotation, has default) per field.
    Nullable fields (and those with a default) may be left out."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, (annotation, has_default) in fields.items():
        inner, nullable = _unwrap_optional(annotation)
        if _is_fd(inner):
            if nullable or has_default:
                continue  # a model cannot pass a file descriptor
            raise ConstraintError(UNSUPPORTED, f"{where}: {name} is a file descriptor")
        schema = _schema(inner, f"{where}.{name}")
        if nullable:
            properties[name] = {"anyOf": [schema, {"type": "null"}]}
        else:
            properties[name] = schema
            if not has_default:
                required.append(name)
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not types.NoneType]
        if len(args) < len(typing.get_args(annotation)):
            # Varlink has no unions: several alternatives are `object`.
            return (args[0] if len(args) == 1 else Any), True
    return annotation, False


def _is_fd(annotation: Any) -> bool:
    from asyncvarlink import FileDescriptor

    return isinstance(annotation, type) and issubclass(annotation, FileDescriptor)


def _scalar_any() -> dict[str, Any]:
    return {"anyOf": [_schema(str, ""), _schema(int, ""), {"type": "boolean"},
                      {"type": "null"}]}


def _schema(annotation: Any, where: str) -> dict[str, Any]:
    """JSON Schema of one Varlink type (as asyncvarlink maps Python types)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer", "minimum": -INT_RANGE, "maximum": INT_RANGE}
    if annotation is float:
        return {"type": "number", "minimum": -FLOAT_RANGE, "maximum": FLOAT_RANGE,
                "multipleOf": 10.0 ** -FLOAT_DECIMALS}
    if annotation is str:
        return {"type": "string", "maxLength": MAX_STRING}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": list(annotation.__members__)}
    if origin is typing.Literal and all(isinstance(a, str) for a in args):
        return {"enum": list(args)}
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        hints = typing.get_type_hints(annotation)
        return _object({f.name: (hints[f.name], False)
                        for f in dataclasses.fields(annotation) if f.init},
                       where)
    if origin is list and len(args) == 1:
        return {"type": "array", "items": _schema(args[0], where), "maxItems": MAX_ITEMS}
    if origin is dict and len(args) == 2 and args[0] is str:
        return {"type": "object", "patternProperties": {KEY_PATTERN: _schema(args[1], where)},
                "additionalProperties": False, "maxProperties": MAX_ITEMS}
    if annotation is Any or annotation is object:
        # Varlink `object`: any JSON, offered as a flat map of scalars.
        return {"type": "object", "patternProperties": {KEY_PATTERN: _scalar_any()},
                "additionalProperties": False, "maxProperties": MAX_ITEMS}
    raise ConstraintError(UNSUPPORTED, f"{where}: cannot constrain type {annotation!r}")


def max_bytes(schema: Any) -> int | None:
    """An upper bound on the compact JSON text of any value valid against
    `schema`, for the subset of JSON Schema that call_schema produces (and
    user schemas that keep to it); None when unbounded or not understood."""
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema:
        return len(json.dumps(schema["const"]).encode())
    if "enum" in schema:
        return max((len(json.dumps(v).encode()) for v in schema["enum"]), default=None)
    branches = schema.get("anyOf", schema.get("oneOf"))
    if branches is not None:
        bounds = [max_bytes(s) for s in branches]
        return None if any(b is None for b in bounds) else max(typing.cast(list[int], bounds))
    kind = schema.get("type")
    if kind == "boolean":
        return 5
    if kind == "null":
        return 4
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        step = schema.get("multipleOf")
        if low is None or high is None or (kind == "number" and step is None):
            return None
        digits = max(len(str(int(low))), len(str(int(high))))
        if kind == "number":
            digits += 1 + max(0, -int(f"{step:e}".split("e")[1]))
        return digits
    if kind == "string":
        length = schema.get("maxLength")
        return None if length is None else 2 + BYTES_PER_CHAR * int(length)
    if kind == "array":
        item, count = max_bytes(schema.get("items")), schema.get("maxItems")
        return None if item is None or count is None else 2 + count * (item + 1)
    if kind == "object":
        return _object_bytes(schema)
    return None


def _object_bytes(schema: Mapping[str, Any]) -> int | None:
    if schema.get("additionalProperties", True) is not False:
        return None
    total = 2
    for name, sub in schema.get("properties", {}).items():
        value = max_bytes(sub)
        if value is None:
            return None
        total += len(json.dumps(name).encode()) + 1 + value + 1
    patterns = schema.get("patternProperties", {})
    if patterns:
        count = schema.get("maxProperties")
        values = [max_bytes(s) for s in patterns.values()]
        if count is None or any(v is None for v in values) or set(patterns) != {KEY_PATTERN}:
            return None
        total += count * (KEY_BYTES + 1 + max(typing.cast(list[int], values)) + 1)
    return total


_TOKENIZERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def tokenizer_for(llama: Any) -> Any:
    """llguidance's view of a loaded llama-cpp-python model's vocabulary
    (an LLTokenizer), built once per model: about a second for 50k tokens.

    This is llguidance.llamacpp.lltokenizer_from_vocab with llama.cpp's
    current vocabulary calls (that one uses deprecated names): every token's
    bytes, control tokens (and user-defined ones that look like them)
    marked with a leading 0xff so grammars never produce them as text, and
    llama.cpp's own tokenizer for the rest."""
    import ctypes

    import llama_cpp
    from llguidance import LLTokenizer

    model = llama._model
    cached = _TOKENIZERS.get(model)
    if cached is not None:
        return cached
    vocab = model.vocab
    size = 1024
    buffer = ctypes.create_string_buffer(size)
    pieces: list[bytes] = []
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        n = llama_cpp.llama_token_to_piece(vocab, token, buffer, size, 0, True)
        if n < 0:
            raise ConstraintError(UNSUPPORTED, f"token {token} is longer than {size} bytes")
        piece = buffer.raw[:n]
        attr = llama_cpp.llama_vocab_get_attr(vocab, token)
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
            attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
            and piece.startswith(b"<") and piece.endswith(b">")
        ):
            piece = b"\xff" + piece
        pieces.append(piece)
    pieces += [b""] * (int(llama.n_vocab()) - len(pieces))
    tokenize = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    tokenizer = LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
        tokens=pieces, vocab_ptr=vocab, tokenize_fptr=tokenize,
        eos_token=llama_cpp.llama_vocab_eos(vocab), slices=None)
    _TOKENIZERS[model] = tokenizer
    return tokenizer


class Guide:
    """The logits processor of one constrained generation.

    Called once per sampled token with every token of the context so far
    (prompt and output) and the logits by token id. The first call marks
    where the output begins; later calls feed the tokens since the previous
    call to the matcher. Errors cannot propagate out of llama.cpp's sampler
    callback, so an unexpected token or a matcher failure is recorded in
    `error` and only end-of-sequence is allowed from then on.
    """

    def __init__(self, constraint: Constraint, tokenizer: Any) -> None:
        import numpy as np
        from llguidance import LLMatcher

        self._np = np
        self._matcher = LLMatcher(tokenizer, constraint.grammar, log_level=0)
        if self._matcher.is_error():
            raise ConstraintError(UNSUPPORTED, self._matcher.get_error().splitlines()[0])
        self._n_vocab = int(tokenizer.vocab_size)
        self._eos = int(tokenizer.eos_token)
        self._words = np.zeros((self._n_vocab + 31) // 32, dtype=np.int32)
        self._start: int | None = None
        self._fed = 0
        self.error: str | None = None

    @property
    def complete(self) -> bool:
        """Whether the output so far is a complete sentence of the grammar."""
        return bool(self._matcher.is_accepting())

    @property
    def output_tokens(self) -> int:
        return self._fed - (self._start or 0)

    def _feed(self, input_ids: Any) -> None:
        if self._start is None:
            self._start = self._fed = len(input_ids)
            return
        new = [int(t) for t in input_ids[self._fed:]]
        self._fed = len(input_ids)
        if new and self.error is None and not self._matcher.consume_tokens(new):
            self.error = self._matcher.get_error().splitlines()[0] or "token refused"

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        np = self._np
        self._feed(input_ids)
        if self.error is not None or self._matcher.is_stopped() or self._matcher.is_error():
            eos = scores[self._eos]
            scores[:] = -np.inf
            scores[self._eos] = eos if np.isfinite(eos) else 0.0
            return scores
        words = self._words
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")
        scores[allowed[: len(scores)] == 0] = -np.inf
        if len(scores) > self._n_vocab:
            scores[self._n_vocab:] = -np.inf
        return scores
