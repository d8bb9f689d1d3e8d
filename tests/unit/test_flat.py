"""syntrop.varlink.flat answers exactly as asyncvarlink's conversion does:
the same result, or the same ConversionError at the same location, for any
JSON a client may send and any reply a method may return."""

from typing import Any

import pytest
from asyncvarlink.conversion import ConversionError, ObjectVarlinkType, VarlinkType
from hypothesis import given, settings
from hypothesis import strategies as st

from syntrop.interfaces.inference import AcquireLeaseResult
from syntrop.varlink.flat import Flat, converter


def _parameters() -> ObjectVarlinkType:
    """A signature's parameter type, built the way asyncvarlink builds it:
    required, optional without a default (populated with None), optional
    with a default (None left out)."""
    def simple(annotation: Any) -> VarlinkType:
        return VarlinkType.from_type_annotation(annotation)

    return ObjectVarlinkType(
        {"name": simple(str), "size": simple(int), "ratio": simple(float),
         "on": simple(bool), "unit": simple(str | None), "pid": simple(int | None).optional(),
         "weight": simple(float | None)},
        populatenone={"unit", "weight"}, discardnone={"pid"})


def _outcome(function: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", function(value)
    except ConversionError as error:
        return "error", (error.message, error.location)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=3),
    max_leaves=6)
KEYS = st.sampled_from(["name", "size", "ratio", "on", "unit", "pid", "weight", "other"])
OBJECTS = st.dictionaries(KEYS, JSON, max_size=8) | JSON


@settings(max_examples=400, deadline=None)
@given(OBJECTS)
def test_from_and_to_json_answer_as_asyncvarlink_does(value: Any) -> None:
    vtype = _parameters()
    fast = converter(vtype)
    assert isinstance(fast, Flat)
    assert _outcome(fast.fromjson, value) == _outcome(vtype.fromjson, value)
    assert _outcome(fast.tojson, value) == _outcome(vtype.tojson, value)


def test_a_well_formed_call_takes_the_fast_path() -> None:
    """No fallback for the usual call: what comes back is built by Flat
    (asyncvarlink's conversion is not reached)."""
    vtype = _parameters()
    fast = converter(vtype)
    assert isinstance(fast, Flat)

    class Refuse(ObjectVarlinkType):
        def fromjson(self, obj: Any, oobstate: Any = None) -> Any:
            raise AssertionError("fell back")

    fast.vtype = Refuse({})
    assert fast.fromjson({"name": "a", "size": 1, "ratio": 0.5, "on": True, "unit": None}) == {
        "name": "a", "size": 1, "ratio": 0.5, "on": True, "unit": None, "weight": None}


def test_nested_types_stay_with_asyncvarlink() -> None:
    nested = ObjectVarlinkType({"items": VarlinkType.from_type_annotation(list[str])})
    assert converter(nested) is nested
    reply = VarlinkType.from_type_annotation(AcquireLeaseResult)
    assert isinstance(converter(reply), Flat)
    assert converter(reply) is converter(reply)  # made once


@pytest.mark.parametrize("value", [{"name": "a"}, {"name": 1, "size": 2}, [], None])
def test_bad_input_raises_asyncvarlinks_error(value: Any) -> None:
    vtype = _parameters()
    assert _outcome(converter(vtype).fromjson, value) == _outcome(vtype.fromjson, value)
    assert _outcome(converter(vtype).fromjson, value)[0] == "error"
