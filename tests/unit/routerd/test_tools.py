"""routerd/tools.py: OpenAI function calling as a decoding schema."""

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syntrop.routerd import tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def _body(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], **extra}


def test_no_tools_or_none_is_no_plan() -> None:
    assert tools.plan(_body()) is None
    assert tools.plan(_body(tools=[WEATHER], tool_choice="none")) is None


def test_required_allows_only_calls_of_declared_functions() -> None:
    plan = tools.plan(_body(tools=[WEATHER, ADD], tool_choice="required"))
    assert plan is not None and plan.choice == "required"
    items = plan.schema["properties"]["tool_calls"]
    assert items["minItems"] == 1 and items["maxItems"] == tools.MAX_CALLS
    names = [c["properties"]["name"]["const"] for c in items["items"]["anyOf"]]
    assert names == ["get_weather", "add"]
    assert items["items"]["anyOf"][0]["properties"]["arguments"] == \
        WEATHER["function"]["parameters"]  # type: ignore[index]


def test_a_named_function_is_the_only_one_and_called_once() -> None:
    plan = tools.plan(_body(tools=[WEATHER, ADD],
                            tool_choice={"type": "function", "function": {"name": "add"}}))
    assert plan is not None and [f.name for f in plan.functions] == ["add"]
    calls = plan.schema["properties"]["tool_calls"]
    assert calls["maxItems"] == 1 and calls["items"]["properties"]["name"]["const"] == "add"


def test_auto_allows_an_answer_too_and_response_format_shapes_it() -> None:
    plan = tools.plan(_body(tools=[WEATHER]))
    assert plan is not None and plan.choice == "auto"
    answer = plan.schema["anyOf"][1]
    assert answer["properties"]["content"] == {"type": "string"}
    shaped = tools.plan(_body(tools=[WEATHER]), {"type": "object"})
    assert shaped is not None and shaped.json_content
    message, finish = tools.reply('{"content": {"x": 1}}', shaped, "stop")
    assert json.loads(message["content"]) == {"x": 1} and finish == "stop"


def test_parallel_tool_calls_false_is_one_call() -> None:
    plan = tools.plan(_body(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False))
    assert plan is not None and plan.schema["properties"]["tool_calls"]["maxItems"] == 1


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": []}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_malformed_tools_say_which_parameter(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(tools.ToolsError) as caught:
        tools.plan(_body(**extra))
    assert caught.value.param == param


def test_messages_carry_instructions_calls_and_results() -> None:
    body: dict[str, Any] = {"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "rain"},
    ], "tools": [WEATHER]}
    turns = tools.messages(body, tools.plan(body))
    assert [role for role, _ in turns] == ["system", "user", "assistant", "user"]
    assert turns[0][1].startswith("Be brief.\n\nYou can call functions") and \
        "get_weather: Weather now." in turns[0][1]
    assert json.loads(turns[2][1]) == {"tool_calls": [{"name": "get_weather",
                                                       "arguments": {"city": "Oslo"}}]}
    assert turns[3][1] == "Result of function call call_9 (get_weather):\nrain"
    without = tools.messages({"messages": body["messages"][1:2]}, tools.plan(body))
    assert without[0][0] == "system"  # the instructions get a turn of their own
    with pytest.raises(tools.ToolsError, match="tool_call_id"):
        tools.messages({"messages": [{"role": "tool", "content": "x"}]}, None)
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    with pytest.raises(tools.ToolsError, match=r"messages\[1\]: runtimed reads text only"):
        tools.messages({"messages": [{"role": "user", "content": "hi"}, image]}, None)


def test_a_reply_becomes_calls_or_content() -> None:
    plan = tools.plan(_body(tools=[WEATHER]))
    assert plan is not None
    message, finish = tools.reply(
        '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}', plan, "stop")
    assert finish == "tool_calls" and message["content"] is None
    call = message["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert tools.reply('{"content":"hello"}', plan, "stop") == (
        {"role": "assistant", "content": "hello"}, "stop")
    # Cut short by max_tokens: no half call, no raw JSON for an answer.
    cut = '{"tool_calls":[{"name":"get_we'
    assert tools.reply(cut, plan, "length") == ({"role": "assistant", "content": None},
                                                "length")
    assert tools.reply('{"content":"hel', plan, "length") == (
        {"role": "assistant", "content": "hel"}, "length")
    shaped = tools.plan(_body(tools=[WEATHER], response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
        {"type": "object"})
    assert shaped is not None
    assert tools.reply('{"content":{"a":[1,', shaped, "length") == (
        {"role": "assistant", "content": '{"a":[1,'}, "length")


def test_a_streamed_call_cut_short_sends_no_call_and_no_json() -> None:
    plan = tools.plan(_body(tools=[WEATHER], tool_choice="required"))
    assert plan is not None
    stream = tools.ToolStream(plan)
    assert stream.feed('{"tool_calls":[{"name":"get_weather","argu') == []
    assert stream.finish("length") == ([], "length")


@given(st.text(), st.lists(st.integers(min_value=1, max_value=7), max_size=30), st.booleans())
def test_a_streamed_answer_is_decoded_exactly_whatever_the_pieces(
        answer: str, cuts: list[int], ascii_only: bool) -> None:
    plan = tools.plan(_body(tools=[WEATHER]))
    assert plan is not None
    text = json.dumps({"content": answer}, ensure_ascii=ascii_only)
    stream = tools.ToolStream(plan)
    out: list[str] = []
    at = 0
    for cut in cuts:
        for delta in stream.feed(text[at:at + cut]):
            out.append(delta["content"])
        at += cut
    for delta in stream.feed(text[at:]):
        out.append(delta["content"])
    last, finish = stream.finish("stop")
    out += [d["content"] for d in last]
    assert "".join(out) == answer and finish == "stop"


def test_streamed_calls_go_out_whole_at_the_end() -> None:
    plan = tools.plan(_body(tools=[WEATHER, ADD], tool_choice="required"))
    assert plan is not None
    stream = tools.ToolStream(plan)
    text = '{"tool_calls":[{"name":"add","arguments":{"a":1}},{"name":"add","arguments":{}}]}'
    assert stream.feed(text[:20]) == [] and stream.feed(text[20:]) == []
    deltas, finish = stream.finish("stop")
    assert finish == "tool_calls" and [d["tool_calls"][0]["index"] for d in deltas] == [0, 1]
