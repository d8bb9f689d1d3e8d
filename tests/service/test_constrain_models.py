"""Constrained decoding on real models: every output parses and validates.

Each mode (JSON Schema, regex, Varlink call) generates at temperature 1 on
the tiny random-weight model and on SmolLM2, through llama-cpp-python's own
`Llama.generate` with `constrain.Guide` as its logits processor, exactly as
runtimed's engine drives it. Every output must end by the end-of-sequence
token within `Constraint.max_tokens` (a regex: within its longest match in
bytes), never by running out of tokens, be complete for the guide,
decode as UTF-8, and validate: strict `json.loads` plus jsonschema, or a
Python `re.fullmatch`, and for Varlink calls also asyncvarlink's own
conversion of every parameter (an oracle independent of the schema the
constraint was built from).

By default each schema, regex and Varlink method is one test, sampled with
the fixed seeds SEEDS on each model (loaded once for the module): few
enough to keep the service tier short, and each test still fails at its
first seed when the guide masks nothing. The issue asks 200 generations
per mode and model; that is SYNTROP_CONSTRAIN_RUNS=200 (random seeds from
SYNTROP_CONSTRAIN_SEED, shared among a mode's schemas, regexes or methods in
turn).
"""

import inspect
import json
import os
import random
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from syntrop.runtimed import constrain
from tests import tinymodel
from tests.models import require_llama, smollm2

require_llama()
#: llama.cpp runs in this process: in a child pytest of its own (tests/isolation.py).
pytestmark = pytest.mark.isolated

#: Generations per mode and model when set (the long run); 0: SEEDS.
RUNS = int(os.environ.get("SYNTROP_CONSTRAIN_RUNS", "0"))
#: The fixed seeds each schema, regex and Varlink method is sampled with.
SEEDS = (1, 2)

SCHEMA = {
    "type": "object",
    "properties": {
        "unit": {"type": "string", "maxLength": 40},
        "restart": {"type": "boolean"},
        "priority": {"enum": ["low", "normal", "high"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        "note": {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}]},
    },
    "required": ["unit", "restart", "priority"],
    "additionalProperties": False,
}
#: Each regex with the length of its longest match in bytes: the token
#: budget (every token the grammar allows carries at least one byte).
REGEXES = {r"(unit|service)-[a-z0-9]{1,12}\.(service|socket|timer)": 7 + 1 + 12 + 1 + 7,
           r"[0-9]{1,3}(\.[0-9]{1,3}){3}": 4 * 3 + 3,
           r"(yes|no)(, because [a-z ]{1,30})?": 3 + 10 + 30}
METHODS = (("io.syntrop.Tool1", "Execute"), ("io.syntrop.Inference1", "AcquireLease"),
           ("io.syntrop.Runtime1", "Complete"), ("io.syntrop.Context1", "GetUnitContext"))
PROMPT = ("Answer with one JSON object that restarts the failed unit nginx.service. "
          "Then stop.")


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def llama(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.models import Llama

    path: Path = (tinymodel.build(tmp_path_factory, "Q8_0") if request.param == "tiny"
                  else smollm2())
    model = Llama(model_path=str(path), n_ctx=2048, n_threads=2, verbose=False)
    yield model
    model.close()


def generate(llama: Any, constraint: constrain.Constraint, seed: int,
             budget: int) -> tuple[bytes, str, constrain.Guide]:
    """Generate once; (output bytes, finish reason, the guide). The reason
    is "stop" for end-of-sequence within `budget` output tokens (the
    end-of-sequence token not counted), "length" for a token beyond it."""
    import llama_cpp

    guide = constrain.Guide(constraint, constrain.tokenizer_for(llama))
    llama.set_seed(seed)
    prompt = llama.tokenize(PROMPT.encode(), add_bos=True)
    out: list[int] = []
    reason = "length"
    for token in llama.generate(prompt, temp=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                repeat_penalty=1.0,
                                logits_processor=llama_cpp.LogitsProcessorList([guide])):
        if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            reason = "stop"
            break
        if len(out) >= budget:
            break
        out.append(token)
    return llama.detokenize(out, special=True), reason, guide


def varlink_check(interface: str, method: str, call: Any) -> None:
    """Validate a call the way the Varlink server would convert it."""
    from asyncvarlink.conversion import OptionalVarlinkType, VarlinkType

    from syntrop.interfaces.catalog import ALL

    contract = next(c for c in ALL if c.name == interface)
    raw = dict(contract.contract_methods())[method]
    assert call["method"] == f"{interface}.{method}"
    parameters = call["parameters"]
    signature = list(inspect.signature(raw).parameters.items())[1:]
    hints = typing.get_type_hints(raw)
    assert set(parameters) <= {name for name, _ in signature}
    for name, declared in signature:
        vtype = VarlinkType.from_type_annotation(hints[name])
        if name in parameters:
            vtype.fromjson(parameters[name])
        else:
            assert isinstance(vtype, OptionalVarlinkType) or declared.default is not declared.empty


def _seeds(mode: str, case: int = 0, cases: int = 1) -> list[int]:
    """The seeds of a mode's `case`-th schema, regex or method of `cases`:
    SEEDS, or with SYNTROP_CONSTRAIN_RUNS its share of that many random
    ones (dealt to the cases in turn)."""
    if not RUNS:
        return list(SEEDS)
    rng = random.Random(f"{mode}-{os.environ.get('SYNTROP_CONSTRAIN_SEED', '')}")
    return [rng.randrange(2**31) for _ in range(RUNS)][case::cases]


def test_json_schema_outputs_validate(llama: Any) -> None:
    constraint = constrain.from_json_schema(SCHEMA)
    assert constraint.max_tokens is not None
    for seed in _seeds("json"):
        text, reason, guide = generate(llama, constraint, seed, constraint.max_tokens)
        assert reason == "stop", (seed, text)
        assert guide.error is None and guide.complete
        value = constrain.check(constraint, text.decode("utf-8", errors="strict"))
        assert set(value) >= {"unit", "restart", "priority"}


@pytest.mark.parametrize("pattern", list(REGEXES), ids=["unit", "address", "answer"])
def test_regex_outputs_match(llama: Any, pattern: str) -> None:
    constraint = constrain.from_regex(pattern)
    longest = REGEXES[pattern]
    for seed in _seeds("regex", list(REGEXES).index(pattern), len(REGEXES)):
        text, reason, guide = generate(llama, constraint, seed, longest)
        assert reason == "stop", (seed, pattern, text)
        assert guide.error is None and guide.complete
        assert re.fullmatch(pattern, text.decode("utf-8", errors="strict")), (pattern, text)
        assert len(text) <= longest


@pytest.mark.parametrize(("interface", "method"), METHODS, ids=[m for _, m in METHODS])
def test_varlink_calls_validate(llama: Any, interface: str, method: str) -> None:
    constraint = constrain.from_varlink(interface, method)
    assert constraint.max_tokens is not None
    for seed in _seeds("varlink", METHODS.index((interface, method)), len(METHODS)):
        text, reason, guide = generate(llama, constraint, seed, constraint.max_tokens)
        assert reason == "stop", (seed, method, text)
        assert guide.error is None and guide.complete
        call = constrain.check(constraint, text.decode("utf-8", errors="strict"))
        varlink_check(interface, method, call)
        assert len(text) <= constraint.max_tokens


def test_varlink_check_rejects_bad_calls() -> None:
    """The independent oracle above can fail."""
    from asyncvarlink.conversion import ConversionError

    good: dict[str, Any] = {"method": "io.syntrop.Inference1.AcquireLease",
                           "parameters": {"priority": "batch", "memory_bytes": 5}}
    varlink_check("io.syntrop.Inference1", "AcquireLease", good)
    with pytest.raises(AssertionError):
        varlink_check("io.syntrop.Inference1", "AcquireLease",
                      {**good, "parameters": {"priority": "batch"}})
    with pytest.raises(ConversionError):
        varlink_check("io.syntrop.Inference1", "AcquireLease",
                      {**good, "parameters": {"priority": 3, "memory_bytes": 5}})
    with pytest.raises(AssertionError):
        varlink_check("io.syntrop.Inference1", "AcquireLease",
                      {**good, "parameters": {**good["parameters"], "bogus": 1}})


def test_strict_json_rejects_raw_newlines() -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads('{"a":"x\ny"}', strict=True)


def test_complete_grammar_leaves_only_end_of_sequence(llama: Any) -> None:
    import numpy as np

    tokenizer = constrain.tokenizer_for(llama)
    guide = constrain.Guide(constrain.from_regex("ab"), tokenizer)
    prompt = [1, 5, 6]
    n_vocab = int(llama.n_vocab())
    scores = guide(prompt, np.zeros(n_vocab, dtype=np.float32))
    allowed = set(np.flatnonzero(np.isfinite(scores)).tolist())
    assert allowed and tokenizer.eos_token not in allowed  # "" is not a match yet
    text = llama.tokenize(b"ab", add_bos=False, special=False)
    scores = guide(prompt + text, np.zeros(n_vocab, dtype=np.float32))
    assert np.flatnonzero(np.isfinite(scores)).tolist() == [tokenizer.eos_token]
    assert guide.complete and guide.error is None and guide.output_tokens == len(text)


def test_a_refused_token_is_recorded(llama: Any) -> None:
    """A token the grammar does not allow (sampled by someone ignoring the
    mask) puts the guide in error: end-of-sequence only from then on."""
    import numpy as np

    tokenizer = constrain.tokenizer_for(llama)
    guide = constrain.Guide(constrain.from_regex("ab"), tokenizer)
    n_vocab = int(llama.n_vocab())
    guide([1], np.zeros(n_vocab, dtype=np.float32))
    bad = llama.tokenize(b"zz", add_bos=False, special=False)
    scores = guide([1, *bad], np.zeros(n_vocab, dtype=np.float32))
    assert guide.error
    assert np.flatnonzero(np.isfinite(scores)).tolist() == [tokenizer.eos_token]
