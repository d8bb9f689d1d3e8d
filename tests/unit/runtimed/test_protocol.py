"""The face ↔ worker messages (protocol.py): every operation crosses the
wire (JSON) and comes back the same typed request; a worker's declared
failure crosses it as a kind and its parameters, and the face raises the
Runtime1 error it stood for before the kinds (same name, same parameters)."""

import json
from typing import Any

import pytest

from syntrop.runtimed import protocol
from syntrop.runtimed.constrain import Constraint
from syntrop.runtimed.protocol import Kind, Options, Placed
from syntrop.runtimed.sampling import Params
from syntrop.runtimed.supervisor import ERRORS, varlink_error

OPTIONS = Options(n_ctx=512, embedding=True)
DECODING = protocol.Decoding(
    params=Params(stop=("\n",), logprobs=2),
    constraint=Constraint(kind="regex", grammar="{}", schema={"type": "string"}),
    speculative=protocol.Speculation(draft="small", draft_max=4))
TURNS = (("system", "be brief"), ("user", "hi"))
#: One of each operation, its optional fields set.
OPERATIONS: list[protocol.Operation] = [
    protocol.Hello(),
    protocol.Load(name="m", digest="sha256:ab", placement=Placed(
        n_gpu_layers=9, tensor_split=(0.5, 0.5), cpu_affinity=(0, 1), why="two")),
    protocol.Load(name="m"),
    protocol.Draft(name="small"),
    protocol.Generate(prompt=protocol.Prompt(text="once"), options=OPTIONS,
                      decoding=protocol.Decoding(params=Params())),
    protocol.Generate(prompt=protocol.Prompt(messages=TURNS, continue_last=True),
                      options=OPTIONS, decoding=DECODING, digest="sha256:ab"),
    protocol.Decode(session="s", decoding=DECODING),
    protocol.Embed(options=OPTIONS, input=("a", "b")),
    protocol.Export(options=OPTIONS, messages=TURNS, digest="sha256:ab"),
    protocol.Open(session="s", options=OPTIONS, lora="l", lora_scale=0.5, sinks=4,
                  prompt_format="chatml"),
    protocol.Prefix(session="s", text="t", add_bos=True, current_digest=None, digest="d"),
    protocol.Suffix(session="s", text="t", prefix_tokens=3),
    protocol.Save(session="s"),
    protocol.Restore(session="s", lora="l"),
    protocol.Close(session="s"),
    protocol.Trim(),
    protocol.Speak(model="v", text="hello", voice="amy", speed=1.5),
]

RUNTIME = "io.syntrop.Runtime1."
#: Each kind, parameters as the worker raises them, and the error's name.
CASES: list[tuple[Kind, dict[str, Any], str]] = [
    (Kind.OVERFLOW, {"tokens": 9, "n_ctx": 8}, RUNTIME + "ContextOverflow"),
    (Kind.INVALID_MODEL, {"model": "m", "reason": "truncated"}, RUNTIME + "InvalidModel"),
    (Kind.INVALID_PARAMETER, {"parameter": "prompt"}, "org.varlink.service.InvalidParameter"),
    (Kind.INVALID_SAMPLING, {"parameter": "reasoning_budget", "reason": "no markers"},
     RUNTIME + "InvalidSampling"),
    (Kind.CONSTRAINT, {"reason": "unsupported", "message": "no"}, RUNTIME + "InvalidConstraint"),
    (Kind.SESSION_MISSING, {"session_id": "ab"}, RUNTIME + "SessionNotFound"),
    (Kind.SHIFT_UNSUPPORTED, {"model": "m"}, RUNTIME + "ShiftUnsupported"),
    (Kind.VOCABULARY_MISMATCH, {"draft": "d", "reason": "tokens"},
     RUNTIME + "VocabularyMismatch"),
    (Kind.ADAPTER_MISMATCH, {"adapter": "a", "reason": "rank"}, RUNTIME + "AdapterMismatch"),
    (Kind.NOT_A_VOICE, {"model": "m"}, RUNTIME + "NotAVoice"),
]


def test_every_operation_is_tried() -> None:
    assert {type(op) for op in OPERATIONS} == set(protocol.OPERATIONS.values())


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: type(op).__name__)
def test_an_operation_comes_back_as_it_was_sent(operation: protocol.Operation) -> None:
    wire = json.loads(json.dumps(protocol.encode(protocol.Request(5, operation))))
    assert wire["op"] == protocol.NAMES[type(operation)] and isinstance(wire["args"], dict)
    assert protocol.decode(wire) == protocol.Request(5, operation)


def test_an_unknown_operation_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown operation"):
        protocol.decode({"id": 1, "op": "reboot", "args": {}})


def test_every_kind_has_its_error() -> None:
    assert set(ERRORS) == set(Kind) == {kind for kind, _, _ in CASES}


@pytest.mark.parametrize(("kind", "parameters", "name"), CASES)
def test_a_declared_failure_reaches_the_caller_as_its_runtime1_error(
        kind: Kind, parameters: dict[str, Any], name: str) -> None:
    wire = protocol.encode(protocol.Failed(7, kind, parameters))
    failed = protocol.decode(wire)
    assert isinstance(failed, protocol.Failed)
    assert (failed.id, failed.kind, failed.parameters) == (7, kind, parameters)
    error: Any = varlink_error(failed)
    assert error.name == name and error.parameters == parameters


def test_an_undeclared_failure_is_words() -> None:
    failed = protocol.decode(protocol.encode(protocol.Failed(3, None, message="boom")))
    assert isinstance(failed, protocol.Failed) and failed.kind is None
    error = varlink_error(failed)
    assert isinstance(error, RuntimeError) and str(error) == "boom"
