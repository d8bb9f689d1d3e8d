"""routerd's checks of OpenAI requests: JSON depth, field types, media type."""

from typing import Any

import pytest

from syntrop.routerd.api import (
    MAX_DEPTH,
    MAX_VALUES,
    BadRequest,
    check,
    parse,
    unsupported_media,
)


def test_parse_bounds_depth_without_a_recursion_error() -> None:
    for depth, why in ((MAX_DEPTH + 1, "nested"), (5000, "nested"), (100_000, "values")):
        with pytest.raises(BadRequest, match=why) as caught:
            parse(b"[" * depth + b"]" * depth)
        assert caught.value.code == "invalid_json"
    assert parse(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    # Many brackets side by side are not deep.
    assert len(parse(b"[" + b"[]," * 1000 + b"[]]")) == 1001


def test_parse_bounds_the_values_before_parsing() -> None:
    with pytest.raises(BadRequest, match=f"over {MAX_VALUES} JSON values"):
        parse(b"[" + b"{}," * MAX_VALUES + b"{}]")
    assert len(parse(b"[" + b"1," * (MAX_VALUES - 2) + b"1]")) == MAX_VALUES - 1
    # Commas and brackets inside strings are not values.
    text = 'a, [b], {c} \\" ' * 10_000
    assert parse(b'{"content": "%s"}' % text.encode())["content"].startswith("a, [b]")


def test_parse_refuses_what_is_not_json() -> None:
    for body in (b"{not json", b"\xff\xfe", b""):
        with pytest.raises(BadRequest, match="not valid JSON"):
            parse(body)


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(("body", "param"), [
    (_chat(stop={"a": 1}), "stop"),
    (_chat(stop=[1]), "stop"),
    (_chat(model=1), "model"),
    (_chat(stream="yes"), "stream"),
    (_chat(frequency_penalty="x"), "frequency_penalty"),
    (_chat(seed=1.5), "seed"),
    (_chat(tool_choice=1), "tool_choice"),
    (_chat(stream_options=[]), "stream_options"),
    (_chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (_chat(messages=[{"role": "user", "content": [{"text": "no type"}]}]),
     "messages[0].content"),
    (_chat(messages=[{"role": "tool", "content": "x", "tool_call_id": 3}]),
     "messages[0].tool_call_id"),
    (_chat(messages=[]), "messages"),
])
def test_a_field_of_the_wrong_type_is_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        check("chat/completions", body)
    assert caught.value.param == param
    assert str(caught.value).startswith(param + " must be")


def test_well_typed_requests_pass() -> None:
    check("chat/completions", _chat(stop="x", temperature=0, tools=[{"type": "function"}],
                                    logit_bias={"1": -1}, user=None, messages=[
                                        {"role": "user", "content": [{"type": "text",
                                                                      "text": "hi"}]},
                                        {"role": "assistant", "content": None,
                                         "tool_calls": [{"id": "1"}]}]))
    check("completions", {"prompt": "x", "stop": ["a", "b"], "logprobs": 2, "echo": True})
    check("embeddings", {"input": ["a"], "dimensions": 8})


def test_only_json_bodies_are_taken() -> None:
    assert unsupported_media(None) is None
    assert unsupported_media(b"application/json") is None
    assert unsupported_media(b"Application/JSON; charset=utf-8") is None
    for kind in (b"text/plain", b"application/x-www-form-urlencoded", b""):
        refused = unsupported_media(kind)
        assert refused is not None and refused.status == 415
