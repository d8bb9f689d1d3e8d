"""Constraint building: schemas, bounds and declared errors (no model)."""

import json
from typing import Any

import jsonschema
import pytest

from syntrop.runtimed import constrain
from syntrop.runtimed.constrain import ConstraintError


def test_json_schema_compiles_and_is_bounded() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "ok": {"type": "boolean"}},
              "required": ["name"], "additionalProperties": False}
    c = constrain.from_json_schema(json.dumps(schema))
    assert c.kind == "json_schema"
    assert c.schema == schema
    # {"name":"<10 chars, 4 bytes each>","ok":false}
    assert c.max_tokens == 2 + (7 + 2 + 40 + 1) + (5 + 5 + 1)


def test_unbounded_schema_has_no_bound() -> None:
    assert constrain.from_json_schema({"type": "string"}).max_tokens is None
    assert constrain.from_json_schema({"type": "object"}).max_tokens is None


@pytest.mark.parametrize("schema", [
    "{not json", "[1, 2]", '{"type": 5}', '{"type": "striing"}', '{"minimum": "x"}',
    '{"$ref": "#/nope"}', '{"required": "name"}',
])
def test_bad_schema_is_declared(schema: str) -> None:
    with pytest.raises(ConstraintError) as caught:
        constrain.from_json_schema(schema)
    assert caught.value.reason == constrain.INVALID_SCHEMA
    assert caught.value.message


@pytest.mark.parametrize("pattern", ["[a-", "(unclosed", "a{2,1}", "\\", "ab\\\\\\", "(?<=a)b"])
def test_bad_regex_is_declared(pattern: str) -> None:
    with pytest.raises(ConstraintError) as caught:
        constrain.from_regex(pattern)
    assert caught.value.reason == constrain.INVALID_REGEX


def test_regex_compiles() -> None:
    assert constrain.from_regex(r"[a-z]{2,5}-\d{3}").kind == "regex"


def test_unknown_interface_and_method() -> None:
    with pytest.raises(ConstraintError) as caught:
        constrain.from_varlink("io.syntrop.Nope1", "Execute")
    assert caught.value.reason == constrain.UNKNOWN_INTERFACE
    with pytest.raises(ConstraintError) as caught:
        constrain.from_varlink("io.syntrop.Tool1", "Nope")
    assert caught.value.reason == constrain.UNKNOWN_METHOD


def test_call_schema_follows_the_idl() -> None:
    schema = constrain.call_schema("io.syntrop.Inference1", "AcquireLease")
    jsonschema.Draft202012Validator.check_schema(schema)
    parameters = schema["properties"]["parameters"]
    # ?string and ?int fields are optional; the others required.
    assert parameters["required"] == ["priority", "memory_bytes"]
    assert list(parameters["properties"]) == ["priority", "memory_bytes", "plane", "unit", "pid",
                                             "exclusive"]
    assert parameters["properties"]["plane"]["anyOf"][1] == {"type": "null"}
    assert parameters["properties"]["priority"]["maxLength"] == constrain.MAX_STRING
    valid: dict[str, Any] = {"method": "io.syntrop.Inference1.AcquireLease",
                             "parameters": {"priority": "batch", "memory_bytes": 1,
                                            "plane": None}}
    jsonschema.validate(valid, schema)
    for bad in ({"method": "io.syntrop.Inference1.Yield", "parameters": valid["parameters"]},
                {"method": valid["method"], "parameters": {"priority": "batch"}},
                {"method": valid["method"], "parameters": {**valid["parameters"], "x": 1}},
                {"method": valid["method"], "parameters": {"priority": "b" * 129,
                                                           "memory_bytes": 1}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_call_schema_nested_types() -> None:
    # Runtime1.Complete: a nullable dataclass with floats and a list.
    schema = constrain.call_schema("io.syntrop.Runtime1", "Complete")
    sampling = schema["properties"]["parameters"]["properties"]["sampling"]["anyOf"][0]
    assert sampling["properties"]["temperature"]["anyOf"][0]["type"] == "number"
    assert sampling["properties"]["stop"]["anyOf"][0]["maxItems"] == constrain.MAX_ITEMS
    # Model1.Register: the fd parameter (nullable) is left out.
    register = constrain.call_schema("io.syntrop.Model1", "Register")
    assert "fd" not in register["properties"]["parameters"]["properties"]
    # Tool1.Execute: `object` parameters become a bounded map of scalars.
    execute = constrain.from_varlink("io.syntrop.Tool1", "Execute")
    assert execute.kind == "varlink" and execute.max_tokens is not None


def test_every_contract_method_compiles() -> None:
    from syntrop.interfaces.catalog import ALL

    for contract in ALL:
        for name, _ in contract.contract_methods():
            c = constrain.from_varlink(contract.name, name)
            assert c.max_tokens is not None, f"{contract.name}.{name} is unbounded"


@pytest.mark.parametrize("value", [
    {"method": "io.syntrop.Runtime1.Complete",
     "parameters": {"model": "é" * 128, "prompt": '"\\' * 64,
                    "sampling": {"max_tokens": -2**53, "temperature": -999999999.999999,
                                 "top_p": 1.5, "top_k": 2**53, "seed": 0,
                                 "stop": ["\U0001f600" * 128] * 8}}},
])
def test_bound_holds_for_extreme_values(value: object) -> None:
    c = constrain.from_varlink("io.syntrop.Runtime1", "Complete")
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert constrain.check(c, text) == value
    assert c.max_tokens is not None
    assert len(text.encode()) <= c.max_tokens


def test_check_is_strict() -> None:
    c = constrain.from_json_schema({"type": "object", "properties": {
        "t": {"type": "number", "multipleOf": 1e-6, "minimum": 0, "maximum": 2}}})
    assert constrain.check(c, '{"t":0.7}') == {"t": 0.7}
    with pytest.raises(jsonschema.ValidationError):
        constrain.check(c, '{"t":0.1234567}')
    with pytest.raises(ValueError):
        constrain.check(c, '{"t":1, "s":"a\nb"}')  # a raw newline in a string
    with pytest.raises(ValueError):
        constrain.check(constrain.from_regex("a"), "a")
