"""The face ↔ worker messages (protocol.py): a worker's declared failure
crosses the wire as a kind and its parameters, and the face raises the
Runtime1 error it stood for before the kinds (same name, same parameters)."""

from typing import Any

import pytest

from syntrop.runtimed import protocol
from syntrop.runtimed.protocol import Kind
from syntrop.runtimed.supervisor import ERRORS, varlink_error

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
