"""Acceptance of routerd: the official OpenAI Python client, unmodified,
(and Anthropic's, on /v1/messages)
does chat, streaming chat, embeddings and model listing through routerd
(socket-activated) to runtimed's SmolLM2; curl streams server-sent events;
/metrics answers the Prometheus text format."""

import http.client
import importlib.util
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conformance import ASK, CITY, GREEDY, SCHEMAS, TOOLS
from tests.models import require_llama, router_node

require_llama()
if importlib.util.find_spec("openai") is None:
    pytest.skip("the openai client is not installed (pip install -e '.[test]')",
                allow_module_level=True)



@dataclass
class Node:
    base_url: str
    port: int


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    with router_node(tmp_path_factory.mktemp("routerd-openai")) as port:
        yield Node(f"http://127.0.0.1:{port}/v1", port)


#: The clients a test made, closed when it ends (an unclosed one's socket is
#: a ResourceWarning whenever the collector gets to it: an error here).
_OPEN: list[Any] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _client(node: Node) -> Any:
    import openai

    client = openai.OpenAI(base_url=node.base_url, api_key="unused", timeout=120,
                           max_retries=0)
    _OPEN.append(client)
    return client


def test_models_are_listed(node: Node) -> None:
    ids = [model.id for model in _client(node).models.list()]
    assert ids[0] == "smollm2"
    assert {"router:fast", "router:hard", "router:auto"} <= set(ids)


def test_one_model_is_retrieved_and_an_unknown_one_is_a_404(node: Node) -> None:
    import openai

    client = _client(node)
    assert client.models.retrieve("smollm2").id == "smollm2"
    assert client.models.retrieve("router:fast").owned_by == "routerd"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat(node: Node) -> None:
    answer = _client(node).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32, temperature=0.2, seed=42)
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    # What it says is the model's business (never asserted); that it said
    # something, and why it stopped, is routerd's.
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_usage_counts_are_runtimeds_own(node: Node) -> None:
    """prompt_tokens is the prompt as the model read it (template included:
    more than the words), completion_tokens what it generated; streamed,
    stream_options.include_usage adds OpenAI's last chunk with the same."""
    client = _client(node)
    arguments: dict[str, Any] = dict(
        model="smollm2", max_tokens=8, temperature=0.0,
        messages=[{"role": "user", "content": "Count: one two three four five"}])
    answer = client.chat.completions.create(**arguments)
    usage = answer.usage
    assert usage is not None and usage.prompt_tokens > 6 and 0 < usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    chunks = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **arguments))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == \
        (usage.prompt_tokens, usage.completion_tokens)  # greedy: the same answer
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_chat(node: Node) -> None:
    """Streamed through an alias: the role once, text in pieces, a finish
    reason on the last chunk only. (Not compared with a whole answer: a
    reused prefix cache may tip a near tie of a greedy decode.)"""
    stream = _client(node).chat.completions.create(
        model="router:auto", stream=True, max_tokens=32, temperature=0.0, seed=42,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    chunks = list(stream)
    assert len(chunks) > 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason is not None for c in chunks] == \
        [False] * (len(chunks) - 1) + [True]
    assert len({c.id for c in chunks}) == 1


def test_json_schema_output_validates_every_time_at_temperature_1(node: Node) -> None:
    """response_format json_schema becomes runtimed's constraint: 50 tries at
    temperature 1, streamed and not, every answer valid against the schema."""
    import jsonschema

    client = _client(node)
    for attempt in range(50):
        arguments: dict[str, Any] = dict(
            model="smollm2", max_tokens=64, temperature=1.0, seed=attempt,
            messages=[{"role": "user", "content": "Name a large city and its population."}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "city", "strict": True, "schema": CITY}})
        if attempt % 5 == 4:
            text = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(stream=True, **arguments)
                           if c.choices)
        else:
            text = client.chat.completions.create(**arguments).choices[0].message.content or ""
        jsonschema.validate(json.loads(text), CITY)


def _valid_call(call: Any, only: str | None = None) -> None:
    import jsonschema

    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in SCHEMAS and call.function.name == (only or call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tool_calls_name_a_declared_function_with_valid_arguments(node: Node) -> None:
    """tool_choice required (20 tries at temperature 1) and a named
    function: finish_reason tool_calls, every call declared, its arguments
    valid against that function's schema."""
    client = _client(node)
    for attempt in range(20):
        answer = client.chat.completions.create(
            model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
            temperature=1.0, seed=attempt, max_tokens=160)
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            _valid_call(call)
    named = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "add"}})
    calls = named.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1
    _valid_call(calls[0], only="add")


def test_tool_calls_stream_as_deltas(node: Node) -> None:
    client = _client(node)
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, stream=True, max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert [d.index for d in deltas] == [0]
    assert deltas[0].function is not None and deltas[0].function.name == "get_weather"
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(deltas[0].function.arguments or ""), SCHEMAS["get_weather"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_auto_and_none_answer_or_call_and_results_go_back(node: Node) -> None:
    """auto: a call or an answer (either is the model's choice), never
    anything else; none: a plain answer; a tool result sent back is read."""
    client = _client(node)
    for attempt in range(5):
        choice = client.chat.completions.create(
            model="smollm2", messages=ASK, tools=TOOLS, tool_choice="auto", seed=attempt,
            temperature=1.0, max_tokens=160).choices[0]
        if choice.finish_reason == "tool_calls":
            assert choice.message.tool_calls and choice.message.content is None
            for call in choice.message.tool_calls:
                _valid_call(call)
        else:
            assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
            assert not choice.message.content.startswith('{"content"')
    plain = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=16)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice="auto", stream=True, seed=3,
        temperature=0, max_tokens=48) if c.choices)
    whole = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice="auto", seed=3,
        temperature=0, max_tokens=48).choices[0].message
    assert streamed == (whole.content or "") or whole.tool_calls
    back = [*ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"}]
    answer = client.chat.completions.create(model="smollm2", messages=back, tools=TOOLS,
                                            max_tokens=32)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage is not None
    longer = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS,
                                            max_tokens=1)
    assert answer.usage.prompt_tokens > longer.usage.prompt_tokens  # the result was read


@pytest.mark.parametrize(("extra", "words"), [
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "does not declare"),
    ({"tool_choice": "required"}, "without tools"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
     "image_url content part is not supported"),
    ({"frequency_penalty": 0.5}, "does not support frequency_penalty"),
    ({"logit_bias": {"50256": -100}}, "does not support logit_bias"),
])
def test_what_runtimed_cannot_do_is_a_400_naming_it(
        node: Node, extra: dict[str, Any], words: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match=words):
        _client(node).chat.completions.create(**{"model": "smollm2", "messages": ASK,
                                                 "max_tokens": 4, **extra})


def test_n_choices_are_served_and_refused_clearly_when_streamed(node: Node) -> None:
    import openai

    client = _client(node)
    answer = client.chat.completions.create(model="smollm2", messages=ASK, n=3, seed=7,
                                            temperature=1.0, max_tokens=8)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert all(c.message.content for c in answer.choices)
    assert answer.usage is not None and answer.usage.completion_tokens <= 24
    with pytest.raises(openai.BadRequestError, match="n > 1 needs stream false"):
        list(client.chat.completions.create(model="smollm2", messages=ASK, n=2, stream=True,
                                            max_tokens=4))
    with pytest.raises(openai.BadRequestError, match="n must be an integer"):
        client.chat.completions.create(model="smollm2", messages=ASK, n=99, max_tokens=4)


def test_json_object_output_is_an_object(node: Node) -> None:
    """json_object has no bound on its length: an answer that ends ("stop")
    is one JSON object; one cut by max_tokens is OpenAI's "length", with
    exactly max_tokens tokens and the start of an object. Which of the two
    a model gives depends on the CPU's kernels (a greedy SmolLM2 ends here on
    one x86-64 variant and repeats itself on another), so both are checked
    for what each must be, and the prompt is asked with two budgets."""
    for max_tokens in (24, 160):
        answer = _client(node).chat.completions.create(
            model="smollm2", max_tokens=max_tokens, temperature=0.0,
            messages=[{"role": "user", "content": "Give a JSON object with a cat's name."}],
            response_format={"type": "json_object"})
        choice, usage = answer.choices[0], answer.usage
        text = choice.message.content or ""
        assert choice.finish_reason in ("stop", "length")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert usage is not None and usage.completion_tokens == max_tokens
            assert text.lstrip().startswith("{")
            with pytest.raises(ValueError):
                json.loads(text)  # cut: not a whole object yet


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"response_format": {"type": "yaml"}}, "response_format", "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
     "response_format", "schema object"),
])
def test_a_bad_response_format_is_a_400_naming_it(node: Node, body: dict[str, Any],
                                                   param: str, words: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=60)
    connection.request("POST", "/v1/chat/completions", body=json.dumps(
        {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **body}),
        headers={"content-type": "application/json"})
    response = connection.getresponse()
    error = json.loads(response.read())["error"]
    connection.close()
    assert response.status == 400 and error["param"] == param and words in error["message"]


def test_a_bad_role_is_a_400_that_says_which_parameter(node: Node) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        _client(node).chat.completions.create(
            model="smollm2", max_tokens=4,
            messages=[{"role": "wizard", "content": "hi"}])
    assert "messages" in str(caught.value), caught.value


def test_embeddings_float_and_base64(node: Node) -> None:
    client = _client(node)
    # The client asks for base64 unless told otherwise, and decodes it.
    default = client.embeddings.create(model="smollm2", input=["a cat", "a dog"])
    floats = client.embeddings.create(model="smollm2", input=["a cat", "a dog"],
                                      encoding_format="float")
    assert [d.index for d in default.data] == [0, 1]
    assert len(default.data[0].embedding) == len(floats.data[0].embedding) > 16
    for a, b in zip(default.data[0].embedding, floats.data[0].embedding, strict=True):
        assert abs(a - b) < 1e-5
    assert abs(sum(x * x for x in floats.data[1].embedding) - 1) < 1e-3  # L2-normalised
    single = client.embeddings.create(model="smollm2", input="a cat", encoding_format="float")
    assert single.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-5)


def test_bad_embedding_input_is_a_400(node: Node) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        _client(node).embeddings.create(model="smollm2", input=[[1, 2, 3]])
    assert caught.value.body["code"] == "invalid_value"  # type: ignore[index]


def test_unknown_model_is_a_404(node: Node) -> None:
    import openai

    with pytest.raises(openai.NotFoundError):
        _client(node).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}])


def test_curl_streams_sse(node: Node, tmp_path: Path) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    body = ('{"model": "smollm2", "stream": true, "max_tokens": 8, "temperature": 0,'
            ' "messages": [{"role": "user", "content": "Say hello"}]}')
    result = subprocess.run(
        [curl, "-sS", "-N", "--max-time", "120", "-D", str(tmp_path / "head"),
         "-H", "content-type: application/json", "-d", body,
         f"{node.base_url}/chat/completions"],
        capture_output=True, text=True, check=True)
    head = (tmp_path / "head").read_text().lower()
    assert "content-type: text/event-stream" in head
    assert "transfer-encoding: chunked" in head
    events = [e for e in result.stdout.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), result.stdout
    assert events[-1] == "data: [DONE]"
    assert len(events) > 2


def test_metrics_are_prometheus_text(node: Node) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    assert response.status == 200
    assert response.getheader("content-type", "").startswith("text/plain; version=0.0.4")
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.startswith(("# HELP ", "# TYPE ")), line
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    assert samples["routerd_resident_memory_bytes"] > 1 << 20
    assert 'routerd_provider_attempts_total{provider="local",outcome="ok"}' in samples


def test_logprobs_are_runtimeds_streamed_and_not(node: Node) -> None:
    """logprobs + top_logprobs (chat) and logprobs N (completions): one entry
    per generated token, each at most 0, alternatives most likely first; the
    tokens join to the text; greedy picks the first alternative."""
    import openai

    client = _client(node)
    answer = client.chat.completions.create(
        model="smollm2", messages=ASK, max_tokens=12, temperature=0, logprobs=True,
        top_logprobs=3)
    choice = answer.choices[0]
    content = choice.logprobs.content if choice.logprobs else None
    assert content and answer.usage is not None
    assert len(content) == answer.usage.completion_tokens
    assert "".join(e.token for e in content) == choice.message.content
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert entry.top_logprobs[0].token == entry.token
    streamed = list(client.chat.completions.create(
        model="smollm2", messages=ASK, max_tokens=12, temperature=0, logprobs=True,
        top_logprobs=3, stream=True))
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content or []]
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    # (Not compared with the whole answer's: a reused prefix cache may tip
    # a near tie; each stream is checked against itself.)
    assert entries and "".join(e.token for e in entries) == text
    assert all(e.top_logprobs[0].token == e.token for e in entries)
    plain = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=4)
    assert plain.choices[0].logprobs is None
    completion = client.completions.create(model="smollm2", prompt="One, two,", max_tokens=6,
                                           temperature=0, logprobs=2)
    legacy = completion.choices[0].logprobs
    assert legacy is not None and legacy.tokens and legacy.token_logprobs
    assert "".join(legacy.tokens) == completion.choices[0].text
    assert legacy.text_offset == [sum(map(len, legacy.tokens[:i]))
                                  for i in range(len(legacy.tokens))]
    assert all(len(top) <= 2 for top in legacy.top_logprobs or [])
    with pytest.raises(openai.BadRequestError, match="top_logprobs must be an integer"):
        client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=2,
                                       logprobs=True, top_logprobs=21)


def test_a_repeated_prefix_is_reported_as_cached_tokens(node: Node) -> None:
    """usage.prompt_tokens_details.cached_tokens is runtimed's own count of
    the prompt tokens a context already held: most of a long system
    prompt the second time."""
    client = _client(node)
    system = "You answer briefly. " * 60
    asked = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    first = client.chat.completions.create(model="smollm2", messages=asked, max_tokens=2,
                                           temperature=0)
    again = client.chat.completions.create(
        model="smollm2", messages=[asked[0], {"role": "user", "content": "Hello"}],
        max_tokens=2, temperature=0)
    for answer in (first, again):
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    assert first.usage is not None and again.usage is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and again.usage.prompt_tokens // 2 < cached < \
        again.usage.prompt_tokens, again.usage


# Anthropic's Messages API (POST /v1/messages) with its official client ---------

def _anthropic(node: Node) -> Any:
    anthropic = pytest.importorskip("anthropic", reason="pip install -e '.[test]'")
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{node.port}", api_key="unused",
                                 timeout=120, max_retries=0)
    _OPEN.append(client)
    return client


def test_anthropic_messages_answer_with_text_and_usage(node: Node) -> None:
    message = _anthropic(node).messages.create(
        model="smollm2", max_tokens=24, extra_body=GREEDY, system="You answer briefly.",
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == "smollm2"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 5 and 0 < message.usage.output_tokens <= 24


def test_anthropic_streaming_gives_the_same_text_as_its_final_message(node: Node) -> None:
    client = _anthropic(node)
    asked = [{"role": "user", "content": "Count from one to five."}]
    with client.messages.stream(model="smollm2", max_tokens=24, extra_body=GREEDY,
                                messages=asked) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1  # token by token, not one lump
    assert "".join(pieces) == final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0
    whole = client.messages.create(model="smollm2", max_tokens=24, extra_body=GREEDY,
                                   messages=asked)
    assert whole.content[0].text == final.content[0].text  # greedy: the same answer


def test_anthropic_tool_use_and_its_result_go_round(node: Node) -> None:
    import jsonschema

    client = _anthropic(node)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    asked: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    called = client.messages.create(model="smollm2", max_tokens=64, tools=tools,
                                    tool_choice={"type": "tool", "name": "get_weather"},
                                    messages=asked)
    uses = [block for block in called.content if block.type == "tool_use"]
    assert called.stop_reason == "tool_use" and len(uses) == 1
    assert uses[0].name == "get_weather" and uses[0].id
    jsonschema.validate(uses[0].input, SCHEMAS["get_weather"])
    answered = client.messages.create(
        model="smollm2", max_tokens=32, tools=tools, tool_choice={"type": "none"},
        messages=[*asked, {"role": "assistant", "content": called.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                "content": "Rain, 4 degrees."}]}])
    assert [block.type for block in answered.content] == ["text"]
    assert answered.stop_reason in ("end_turn", "max_tokens")


def test_anthropic_errors_are_typed_by_the_client(node: Node) -> None:
    import anthropic

    client = _anthropic(node)
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=4,
                               messages=[{"role": "user", "content": "Hi"}])
    body = missing.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="not supported"):
        client.messages.create(model="smollm2", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])


def test_rerank_orders_documents_by_embedding_similarity(node: Node) -> None:
    """/v1/rerank in llama-server's shape, scored by the cosine of
    SmolLM2's embeddings: a document equal to the query ranks first."""
    import httpx

    query = "How do I restart a failed systemd service?"
    documents = ["Bananas are rich in potassium.", query,
                 "The stock market closed higher on Friday."]
    for path in ("/v1/rerank", "/rerank"):
        response = httpx.post(f"http://127.0.0.1:{node.port}{path}", timeout=120, json={
            "model": "smollm2", "query": query, "documents": documents, "top_n": 2,
            "return_documents": True})
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["model"] == "smollm2 (embedding cosine)"
        results = answer["results"]
        assert len(results) == 2
        assert results[0]["index"] == 1 and results[0]["document"]["text"] == query
        assert results[0]["relevance_score"] == pytest.approx(1.0, abs=1e-4)
        assert results[0]["relevance_score"] >= results[1]["relevance_score"]
        assert answer["usage"]["prompt_tokens"] > 0
    bad = httpx.post(f"http://127.0.0.1:{node.port}/v1/rerank", timeout=10,
                     json={"model": "smollm2", "query": query})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "documents"


# OpenAI's Responses API, stateful ----------------------------------------------


def test_responses_continue_a_stored_conversation_by_id(node: Node) -> None:
    import openai

    client = _client(node)
    first = client.responses.create(model="smollm2", input="My name is Ada. Say hello.",
                                    instructions="You answer briefly.", max_output_tokens=16,
                                    temperature=0)
    assert first.id.startswith("resp_") and first.status in ("completed", "incomplete")
    assert first.output_text and first.store is True
    second = client.responses.create(model="smollm2", previous_response_id=first.id,
                                     input="What is my name?", max_output_tokens=16,
                                     temperature=0)
    assert second.previous_response_id == first.id and second.output_text
    assert first.usage is not None and second.usage is not None
    # The first exchange is in the second's prompt: more tokens in, most of
    # them already in runtimed's cache.
    assert second.usage.input_tokens > first.usage.input_tokens + 5
    assert client.responses.retrieve(second.id).output_text == second.output_text

    unkept = client.responses.create(model="smollm2", input="Hi", max_output_tokens=4,
                                     store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="smollm2", previous_response_id=unkept.id, input="Hi")
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


def test_responses_function_calls_and_their_outputs_go_round_three_turns(
        node: Node) -> None:
    import jsonschema

    client = _client(node)
    tools: list[Any] = [{"type": "function", "name": t["function"]["name"],
                         "description": t["function"]["description"],
                         "parameters": t["function"]["parameters"]} for t in TOOLS]
    called = client.responses.create(model="smollm2", input="What is the weather in Oslo?",
                                     tools=tools, max_output_tokens=64,
                                     tool_choice={"type": "function", "name": "get_weather"})
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS["get_weather"])
    answered = client.responses.create(
        model="smollm2", previous_response_id=called.id, tools=tools, tool_choice="none",
        max_output_tokens=24,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "Rain, 4 degrees."}])
    assert [item.type for item in answered.output] == ["message"]
    assert answered.output_text
    # A third turn on the same stored conversation: the call, its output and
    # the answer are all in its prompt.
    third = client.responses.create(model="smollm2", previous_response_id=answered.id,
                                    input="And tomorrow?", max_output_tokens=16)
    assert third.output_text and third.previous_response_id == answered.id
    assert answered.usage is not None and third.usage is not None
    assert third.usage.input_tokens > answered.usage.input_tokens


def test_responses_stream_the_same_text_as_their_final_response(node: Node) -> None:
    client = _client(node)
    with client.responses.stream(model="smollm2", input="Count from one to five.",
                                 max_output_tokens=24, temperature=0) as stream:
        events = list(stream)
    # response.completed, or response.incomplete where max_output_tokens cut it
    assert events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == final.output_text
    kept = client.responses.retrieve(final.id)
    assert kept.output_text == final.output_text
