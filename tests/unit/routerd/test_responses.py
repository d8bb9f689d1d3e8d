"""routerd's Responses API (pure parts and the store on a real SQLite file):
items into chat messages, answers into output items, a conversation kept
and continued by id, streams as Responses events."""

import asyncio
import json
import sqlite3
import time
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


def _size(tmp_path: Path) -> int:
    """Bytes of the store's files (the database, its WAL and shared memory)."""
    return sum(path.stat().st_size for path in tmp_path.glob("responses.sqlite*"))


def test_only_what_the_model_is_sent_is_stored(tmp_path: Path) -> None:
    api = responses.Responses(responses.Store(tmp_path / "responses.sqlite"))
    chat = Chat(_answer({"content": "Hi.", "reasoning_content": "thinking " * 100}))
    status, made = _post(api, chat, model="m", input=[
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "encrypted_content": "x" * 1000},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "user",
         "content": [{"type": "input_text", "text": "Hel"},
                     {"type": "input_text", "text": "lo"}]},
        {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "c",
         "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "id": "fco_1", "call_id": "c", "output": "ok"}])
    assert status == 200
    kept = asyncio.run(api.store.get(made["id"]))
    assert kept is not None and kept.response == made
    assert kept.conversation == [
        {"type": "message", "role": "user", "content": "Hello"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
        {"type": "message", "role": "assistant", "content": "Hi."}]
    api.store.close()


def test_a_megabyte_reasoning_item_and_30_turns_keep_the_store_small(
        tmp_path: Path) -> None:
    """Each turn stores only its own items, and no reasoning: the old store
    kept the whole history again each turn (31 MB here)."""
    api = responses.Responses(responses.Store(tmp_path / "responses.sqlite"))
    chat = Chat(*[_answer({"content": f"Answer {turn}."}) for turn in range(31)])
    status, last = _post(api, chat, model="m", input=[
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "r" * (1 << 20)}]},
        {"role": "user", "content": "Turn 0."}])
    assert status == 200
    for turn in range(1, 31):
        status, last = _post(api, chat, model="m", previous_response_id=last["id"],
                             input=f"Turn {turn}.")
        assert status == 200
    assert chat.asked[-1]["messages"][-3:] == [
        {"role": "user", "content": "Turn 29."}, {"role": "assistant", "content": "Answer 29."},
        {"role": "user", "content": "Turn 30."}]
    api.store.close()  # the WAL copied in
    assert _size(tmp_path) < 256 * 1024
    store = responses.Store(tmp_path / "responses.sqlite")
    kept = asyncio.run(store.get(last["id"]))
    assert kept is not None and len(kept.conversation) == 62
    store.close()


def test_history_is_stored_once_and_outlives_a_deleted_turn(tmp_path: Path) -> None:
    """30 turns of 20 kB: stored once, 0.6 MB (stored again each turn,
    9.3 MB); a deleted or dropped turn's items stay while a later one needs
    them, and go with the last one that does."""
    store = responses.Store(tmp_path / "responses.sqlite")
    text = "w" * 20_000

    async def turns() -> None:
        conversation: list[dict[str, Any]] = []
        previous = None
        for turn in range(30):
            conversation = [*conversation, {"type": "message", "role": "user",
                                             "content": f"{turn} {text}"}]
            await store.put({"id": f"resp_{turn}"}, conversation, previous=previous)
            previous = f"resp_{turn}"

    asyncio.run(turns())
    store.close()  # the WAL copied in
    assert _size(tmp_path) < 1 << 20
    store = responses.Store(tmp_path / "responses.sqlite")
    assert asyncio.run(store.delete("resp_10")) is True
    assert asyncio.run(store.get("resp_10")) is None
    assert asyncio.run(store.delete("resp_10")) is False
    kept = asyncio.run(store.get("resp_29"))
    assert kept is not None
    assert [item["content"].split()[0] for item in kept.conversation] == \
        [str(turn) for turn in range(30)]
    for turn in range(29, -1, -1):
        asyncio.run(store.delete(f"resp_{turn}"))
    rows = store._db().sync(lambda c: c.execute("SELECT count(*) FROM responses").fetchone())
    assert rows == (0,)
    store.close()


def test_a_conversation_over_its_caps_is_refused(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    api = responses.Responses(responses.Store(tmp_path / "responses.sqlite"))
    chat = Chat(*[_answer({"content": "ok"}) for _ in range(4)])
    # the default byte cap, 1 MiB: one input over it
    status, refused = _post(api, chat, model="m", input="x" * (1 << 20))
    assert status == 400 and refused["error"]["code"] == "conversation_too_large"
    assert str(1 << 20) in refused["error"]["message"] and chat.asked == []
    # without storing, nothing is capped
    assert _post(api, chat, model="m", input="x" * (1 << 20), store=False)[0] == 200

    monkeypatch.setattr(responses, "MAX_CONVERSATION_ITEMS", 5)
    status, first = _post(api, chat, model="m", input="one")
    status, second = _post(api, chat, model="m", previous_response_id=first["id"],
                           input="two")
    assert status == 200  # 4 items
    status, refused = _post(api, chat, model="m", previous_response_id=second["id"],
                            input=[{"role": "user", "content": "three"},
                                   {"role": "user", "content": "four"}])
    assert status == 400 and refused["error"]["param"] == "input"
    assert "cap of 5 items" in refused["error"]["message"]
    assert len(chat.asked) == 3

    monkeypatch.setattr(responses, "MAX_CONVERSATION_ITEMS", 256)
    kept = asyncio.run(api.store.get(second["id"]))
    assert kept is not None
    monkeypatch.setattr(responses, "MAX_CONVERSATION_BYTES", kept.size + 100)
    status, refused = _post(api, chat, model="m", previous_response_id=second["id"],
                            input="y" * 200)
    assert status == 400 and f"cap of {kept.size + 100} bytes" in refused["error"]["message"]
    api.store.close()


def test_each_owner_keeps_its_newest_responses(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Over MAX_PER_OWNER, an owner's oldest go first; others' stay; a kept
    continuation still reads the history of the dropped."""
    monkeypatch.setattr(responses, "MAX_PER_OWNER", 3)
    store = responses.Store(tmp_path / "responses.sqlite")

    async def fill() -> None:
        await store.put({"id": "other"}, [{"type": "message", "role": "user",
                                           "content": "b"}], "key:b")
        conversation: list[dict[str, Any]] = []
        for index in range(5):
            conversation = [*conversation, {"type": "message", "role": "user",
                                            "content": str(index)}]
            await store.put({"id": f"resp_{index}"}, conversation, "key:a",
                            f"resp_{index - 1}" if index else None)
            await asyncio.sleep(0.002)  # distinct creation times

    asyncio.run(fill())
    assert [asyncio.run(store.get(f"resp_{index}", "key:a")) is not None
            for index in range(5)] == [False, False, True, True, True]
    assert asyncio.run(store.get("other", "key:b")) is not None
    kept = asyncio.run(store.get("resp_4", "key:a"))
    assert kept is not None and [item["content"] for item in kept.conversation] == \
        ["0", "1", "2", "3", "4"]
    store.close()


def test_an_unknown_item_type_is_refused_by_name(tmp_path: Path) -> None:
    api = responses.Responses(responses.Store(tmp_path / "responses.sqlite"))
    chat = Chat(_answer({"content": "ok"}))
    status, refused = _post(api, chat, model="m", input=[
        {"role": "user", "content": "hi"}, {"type": "computer_call", "id": "cc_1"}])
    assert status == 400 and refused["error"]["param"] == "input[1]"
    assert "'computer_call'" in refused["error"]["message"] and chat.asked == []
    status, refused = _post(api, chat, model="m", input=[{"type": "reasoning", "summary": []}])
    assert status == 400 and refused["error"]["param"] == "input" and chat.asked == []
    api.store.close()


def test_responses_stored_before_the_chain_are_read_and_continued(tmp_path: Path) -> None:
    """A database of the previous schema (a whole conversation a row) is
    migrated: its rows are roots of their chains."""
    path = tmp_path / "responses.sqlite"
    old = sqlite3.connect(path)
    for script in responses.MIGRATIONS[:2]:
        for statement in script.split(";"):
            old.execute(statement)
    old.execute("PRAGMA user_version = 2")
    conversation = [{"type": "message", "role": "user", "content": "Hi"},
                    {"type": "message", "role": "assistant", "content": "Hello."}]
    old.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?)",
                ("resp_old", time.time(), json.dumps(conversation),
                 json.dumps({"id": "resp_old"}), "key:a"))
    old.commit()
    old.close()
    api = responses.Responses(responses.Store(path))
    chat = Chat(_answer({"content": "Again."}))
    answer = asyncio.run(api.handle("POST", "/v1/responses", json.dumps(
        {"model": "m", "previous_response_id": "resp_old", "input": "More"}).encode(),
        chat, "key:a"))
    assert answer.status == 200
    assert chat.asked[0]["messages"] == [{"role": "user", "content": "Hi"},
                                         {"role": "assistant", "content": "Hello."},
                                         {"role": "user", "content": "More"}]
    kept = asyncio.run(api.store.get(json.loads(answer.body)["id"], "key:a"))
    assert kept is not None and len(kept.conversation) == 4
    api.store.close()
