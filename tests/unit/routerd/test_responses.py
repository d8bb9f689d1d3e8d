"""routerd's Responses API (pure parts and the store on a real SQLite file):
items into chat messages, answers into output items, a conversation kept
and continued by id, streams as Responses events."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from syntrop.routerd import responses
from syntrop.routerd.api import BadRequest, Response


def test_items_become_chat_messages_calls_grouped() -> None:
    conversation: list[dict[str, Any]] = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Weather in "},
                     {"type": "input_text", "text": "Oslo and Bergen?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"c": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"c": "Bergen"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "function_call_output", "call_id": "c2", "output": "sun"},
    ]
    assert responses.messages(conversation) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w",
                                                          "arguments": '{"c": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "w",
                                                          "arguments": '{"c": "Bergen"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "tool", "tool_call_id": "c2", "content": "sun"},
    ]


def test_a_request_becomes_a_chat_request() -> None:
    chat = responses.to_chat({
        "model": "m", "instructions": "Answer in JSON.", "max_output_tokens": 40,
        "temperature": 0.5, "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"},
                   "strict": True}],
        "tool_choice": {"type": "function", "name": "w"},
        "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
        "stream": True}, [{"type": "message", "role": "user", "content": "hi"}])
    assert chat == {
        "messages": [{"role": "system", "content": "Answer in JSON."},
                     {"role": "user", "content": "hi"}],
        "model": "m", "max_tokens": 40, "temperature": 0.5,
        "tools": [{"type": "function", "function": {"name": "w",
                                                    "parameters": {"type": "object"},
                                                    "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "w"}},
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "a", "schema": {"type": "object"}, "strict": True}},
        "reasoning_effort": "low", "stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize(("request_", "param"), [
    ({"input": []}, "input"),
    ({"input": 3}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content"),
    ({"input": [{"type": "function_call", "call_id": "c"}]}, "input[0]"),
    ({"input": [{"type": "web_search_call"}]}, "input[0]"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"input": "x", "instructions": 4}, "instructions"),
])
def test_bad_requests_name_the_field(request_: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as bad:
        responses.to_chat(request_, responses.items(request_["input"]))
    assert bad.value.param == param


class Chat:
    """A chat endpoint that answers from a script and keeps what it was asked."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.asked: list[dict[str, Any]] = []

    async def __call__(self, body: bytes) -> Response:
        self.asked.append(json.loads(body))
        return Response(200, json.dumps(self.answers.pop(0)).encode())


def _answer(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}


def _post(api: responses.Responses, chat: Chat, **request: Any) -> tuple[int, Any]:
    answer = asyncio.run(api.handle("POST", "/v1/responses", json.dumps(request).encode(),
                                    chat))
    return answer.status, json.loads(answer.body)


def test_a_conversation_is_kept_continued_by_id_and_deleted(tmp_path: Path) -> None:
    api = responses.Responses(responses.Store(tmp_path / "responses.sqlite"))
    chat = Chat(_answer({"content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "w", "arguments": '{"c": "Oslo"}'}}]}, "tool_calls"),
                _answer({"content": "Rain in Oslo."}),
                _answer({"content": "Yes, bring one."}, "length"))
    status, first = _post(api, chat, model="m", instructions="Be brief.", input="Weather?",
                          tools=[{"type": "function", "name": "w"}])
    assert status == 200 and first["status"] == "completed"
    assert [item["type"] for item in first["output"]] == ["function_call"]
    call = first["output"][0]
    assert (call["call_id"], call["name"]) == ("call_1", "w")
    assert first["usage"]["input_tokens"] == 5 and first["usage"]["total_tokens"] == 8

    status, second = _post(api, chat, model="m", previous_response_id=first["id"], input=[
        {"type": "function_call_output", "call_id": "call_1", "output": "rain"}])
    assert status == 200 and second["previous_response_id"] == first["id"]
    assert second["output"][0]["content"][0]["text"] == "Rain in Oslo."
    # the instructions are the request's own: not carried to the continuation
    assert chat.asked[1]["messages"] == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "w", "arguments": '{"c": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]

    status, third = _post(api, chat, model="m", previous_response_id=second["id"],
                          input="Umbrella?", store=False)
    assert third["status"] == "incomplete"
    assert third["incomplete_details"] == {"reason": "max_output_tokens"}
    assert chat.asked[2]["messages"][-2:] == [
        {"role": "assistant", "content": "Rain in Oslo."}, {"role": "user", "content": "Umbrella?"}]
    # store: false is honoured: nothing to continue or fetch
    status, missing = _post(api, chat, model="m", previous_response_id=third["id"], input="x")
    assert status == 404 and missing["error"]["param"] == "previous_response_id"

    got = asyncio.run(api.handle("GET", f"/v1/responses/{second['id']}", b"", chat))
    assert got.status == 200 and json.loads(got.body) == second
    gone = asyncio.run(api.handle("DELETE", f"/v1/responses/{second['id']}", b"", chat))
    assert json.loads(gone.body)["deleted"] is True
    assert asyncio.run(api.handle("GET", f"/v1/responses/{second['id']}", b"",
                                  chat)).status == 404
    api.store.close()


def test_a_response_is_its_callers_alone(tmp_path: Path) -> None:
    """With API keys, a stored response is seen, continued and deleted only
    by the key that made it; to another it does not exist."""
    api = responses.Responses(responses.Store(tmp_path / "responses.sqlite"))
    chat = Chat(_answer({"content": "Hello."}), _answer({"content": "Again."}))

    def call(method: str, path: str, owner: str, **request: Any) -> tuple[int, Any]:
        body = json.dumps(request).encode() if request else b""
        answer = asyncio.run(api.handle(method, path, body, chat, owner))
        return answer.status, json.loads(answer.body)

    status, made = call("POST", "/v1/responses", "key:a", model="m", input="Hi")
    assert status == 200
    path = f"/v1/responses/{made['id']}"
    for owner in ("key:b", ""):
        assert call("GET", path, owner)[0] == 404
        assert call("DELETE", path, owner)[0] == 404
        status, refused = call("POST", "/v1/responses", owner, model="m",
                               previous_response_id=made["id"], input="More")
        assert status == 404 and refused["error"]["param"] == "previous_response_id"
    assert call("GET", path, "key:a") == (200, made)
    assert call("POST", "/v1/responses", "key:a", model="m", previous_response_id=made["id"],
                input="More")[0] == 200
    assert call("DELETE", path, "key:a")[0] == 200
    api.store.close()


def test_the_store_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(responses, "MAX_STORED", 3)
    store = responses.Store(tmp_path / "responses.sqlite")

    async def fill() -> list[bool]:
        for index in range(5):
            await store.put({"id": f"resp_{index}"}, [])
            await asyncio.sleep(0.002)  # distinct creation times
        return [await store.get(f"resp_{index}") is not None for index in range(5)]

    assert asyncio.run(fill()) == [False, False, True, True, True]
    store.close()


def test_a_stream_becomes_responses_events_and_is_kept(tmp_path: Path) -> None:
    def delta(**fields: Any) -> dict[str, Any]:
        return {"id": "c", "model": "m", "choices": [{"index": 0, "delta": fields,
                                                      "finish_reason": None}]}

    chunks = [delta(reasoning_content="so"), delta(content="Hel"), delta(content="lo"),
              delta(tool_calls=[{"index": 0, "id": "call_9",
                                 "function": {"name": "f", "arguments": '{"a"'}}]),
              delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]),
              {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {},
                                                     "finish_reason": "tool_calls"}]},
              {"id": "c", "model": "m", "choices": [],
               "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}}]

    async def sse() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    async def chat(body: bytes) -> Response:
        return Response(200, content_type="text/event-stream", stream=sse())

    api = responses.Responses(responses.Store(tmp_path / "responses.sqlite"))

    async def run() -> list[dict[str, Any]]:
        answer = await api.handle("POST", "/v1/responses", json.dumps(
            {"model": "m", "input": "hi", "stream": True}).encode(), chat)
        assert answer.stream is not None
        text = b"".join([part async for part in answer.stream]).decode()
        return [json.loads(block.split("\ndata: ")[1]) for block in text.strip().split("\n\n")]

    events = asyncio.run(run())
    kinds = [event["type"] for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") \
        == "Hello"
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == \
        ["reasoning", "message", "function_call"]
    final = events[-1]["response"]
    assert final["output"][2]["arguments"] == '{"a": 1}'
    assert final["usage"]["output_tokens"] == 4
    kept = asyncio.run(api.store.get(final["id"]))
    assert kept is not None and kept[1] == final
    assert kept[0][-1] == {"type": "function_call", "call_id": "call_9", "name": "f",
                           "arguments": '{"a": 1}'}
    api.store.close()


def test_a_stream_skips_what_is_not_a_chunk_and_tags_each_calls_fragments(
        tmp_path: Path) -> None:
    def calls(*parts: tuple[int, dict[str, Any]]) -> dict[str, Any]:
        return {"id": "c", "model": "m", "choices": [{"index": 0, "finish_reason": None,
                "delta": {"tool_calls": [{"index": i, **p} for i, p in parts]}}]}

    async def sse() -> AsyncIterator[bytes]:
        yield b"data: not json\n\n"
        yield b"data: [1, 2]\n\n"
        for chunk in (calls((0, {"id": "a", "function": {"name": "f", "arguments": "{"}})),
                      calls((1, {"id": "b", "function": {"name": "g", "arguments": "["}})),
                      calls((0, {"function": {"arguments": "}"}})),
                      calls((1, {"function": {"arguments": "]"}}))):
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    async def chat(body: bytes) -> Response:
        return Response(200, content_type="text/event-stream", stream=sse())

    api = responses.Responses(responses.Store(tmp_path / "responses.sqlite"))

    async def run() -> list[dict[str, Any]]:
        answer = await api.handle("POST", "/v1/responses", json.dumps(
            {"model": "m", "input": "hi", "stream": True, "store": False}).encode(), chat)
        assert answer.stream is not None
        text = b"".join([part async for part in answer.stream]).decode()
        return [json.loads(block.split("\ndata: ")[1]) for block in text.strip().split("\n\n")]

    events = asyncio.run(run())
    assert events[-1]["type"] == "response.completed"
    fragments = [(e["output_index"], e["delta"]) for e in events
                 if e["type"] == "response.function_call_arguments.delta"]
    assert fragments == [(0, "{"), (1, "["), (0, "}"), (1, "]")]
    assert [i["arguments"] for i in events[-1]["response"]["output"]] == ["{}", "[]"]
    api.store.close()
