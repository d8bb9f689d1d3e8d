"""routerd's Messages API translation (pure): requests into chat requests,
answers and streamed chunks back into Anthropic's shapes."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from syntrop.routerd import anthropic
from syntrop.routerd.api import BadRequest, Response


def test_a_conversation_with_a_tool_round_trip_becomes_chat_messages() -> None:
    chat = anthropic.to_chat({
        "model": "smollm2", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["\n\n"], "temperature": 0.2, "top_k": 5,
        "tools": [{"name": "weather", "description": "Weather of a city",
                   "input_schema": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "call it", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "weather",
                 "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                {"type": "text", "text": "And so?"}]},
        ]})
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "rain"},
        {"role": "user", "content": "And so?"},
    ]
    assert chat["tools"][0]["function"]["parameters"]["properties"] == {
        "city": {"type": "string"}}
    assert chat["tool_choice"] == "required"
    assert chat["parallel_tool_calls"] is False
    assert (chat["stop"], chat["temperature"], chat["top_k"], chat["max_tokens"]) == \
        (["\n\n"], 0.2, 5, 64)
    assert "stream" not in chat


@pytest.mark.parametrize(("thinking", "effort"), [
    ({"type": "enabled", "budget_tokens": 100}, "low"),
    ({"type": "enabled", "budget_tokens": 1024}, "medium"),
    ({"type": "enabled", "budget_tokens": 8000}, "high"),
    ({"type": "disabled"}, "none"),
])
def test_a_thinking_budget_becomes_an_effort(thinking: dict[str, Any], effort: str) -> None:
    chat = anthropic.to_chat({"max_tokens": 8, "thinking": thinking,
                              "messages": [{"role": "user", "content": "hi"}]})
    assert chat["reasoning_effort"] == effort


@pytest.mark.parametrize(("request_", "param"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "messages[0].content"),
    ({"max_tokens": 8, "tool_choice": {"type": "sometimes"},
      "messages": [{"role": "user", "content": "hi"}]}, "tool_choice"),
    ({"max_tokens": 8, "thinking": {"type": "enabled"},
      "messages": [{"role": "user", "content": "hi"}]}, "thinking"),
    ({"max_tokens": 8, "stop_sequences": "x",
      "messages": [{"role": "user", "content": "hi"}]}, "stop_sequences"),
])
def test_bad_requests_name_the_field(request_: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as bad:
        anthropic.to_chat(request_)
    assert bad.value.param == param


def test_an_answer_with_thinking_text_and_a_call_becomes_blocks() -> None:
    reply = anthropic.from_chat({
        "id": "chatcmpl-abc", "model": "smollm2",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me look.", "reasoning_content": "hmm",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7,
                  "prompt_tokens_details": {"cached_tokens": 4}}}, "smollm2")
    assert reply["id"] == "msg_abc"
    assert reply["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}}]
    assert reply["stop_reason"] == "tool_use"
    assert reply["usage"]["input_tokens"] == 12
    assert reply["usage"]["output_tokens"] == 7
    assert reply["usage"]["cache_read_input_tokens"] == 4


def _sse(*chunks: dict[str, Any]) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for chunk in chunks:
            data = f"data: {json.dumps(chunk)}\n\n".encode()
            # split mid-event: the translation must not care how bytes arrive
            yield data[:7]
            yield data[7:]
        yield b"data: [DONE]\n\n"
    return gen()


def _events(response: Response) -> list[tuple[str, dict[str, Any]]]:
    async def collect() -> bytes:
        assert response.stream is not None
        return b"".join([part async for part in response.stream])

    text = asyncio.run(collect()).decode()
    out = []
    for block in text.strip().split("\n\n"):
        kind, data = block.split("\n")
        out.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_stream_becomes_messages_events_in_order() -> None:
    def delta(**fields: Any) -> dict[str, Any]:
        return {"id": "chatcmpl-s", "model": "m",
                "choices": [{"index": 0, "delta": fields, "finish_reason": None}]}

    chunks = (delta(role="assistant", reasoning_content="so"), delta(content="Hel"),
              delta(content="lo"),
              delta(tool_calls=[{"index": 0, "id": "c1", "type": "function",
                                 "function": {"name": "f", "arguments": "{\"a\""}}]),
              delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]),
              {"id": "chatcmpl-s", "model": "m",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
              {"id": "chatcmpl-s", "model": "m", "choices": [],
               "usage": {"prompt_tokens": 3, "completion_tokens": 5}})

    async def chat(body: bytes) -> Response:
        sent = json.loads(body)
        assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
        return Response(200, content_type="text/event-stream", stream=_sse(*chunks))

    response = asyncio.run(anthropic.messages("POST", json.dumps(
        {"model": "m", "max_tokens": 9, "stream": True,
         "messages": [{"role": "user", "content": "hi"}]}).encode(), chat))
    events = _events(response)
    kinds = [kind for kind, _ in events]
    assert kinds == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert events[0][1]["message"]["id"] == "msg_s"
    assert [e["content_block"]["type"] for k, e in events if k == "content_block_start"] == \
        ["thinking", "text", "tool_use"]
    assert "".join(e["delta"].get("text", "") for k, e in events
                   if k == "content_block_delta") == "Hello"
    assert "".join(e["delta"].get("partial_json", "") for k, e in events
                   if k == "content_block_delta") == '{"a": 1}'
    assert [e["index"] for k, e in events if k == "content_block_stop"] == [0, 1, 2]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"input_tokens": 3, "output_tokens": 5}


def test_errors_come_in_anthropics_shape() -> None:
    async def chat(body: bytes) -> Response:
        return Response(404, json.dumps({"error": {"message": "no model 'x'",
                                                   "type": "invalid_request_error"}}).encode())

    for method, body, status, kind in (
            ("POST", b'{"max_tokens": 1, "messages": [{"role": "user", "content": "a"}]}',
             404, "not_found_error"),
            ("POST", b"{", 400, "invalid_request_error"),
            ("POST", b'{"messages": []}', 400, "invalid_request_error"),
            ("GET", b"", 405, "invalid_request_error")):
        response = asyncio.run(anthropic.messages(method, body, chat))
        payload = json.loads(response.body)
        assert response.status == status
        assert payload["type"] == "error"
        assert payload["error"]["type"] == kind
        assert payload["error"]["message"]
