"""The feature checks: each takes (an openai client, an anthropic client or
None, a model name), exercises one feature through the official client and
says whether it worked. A failed expectation or any exception is a fail
whose reason is one line; the latency is the check's requests, end to end.
"""

import base64
import json
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Two functions, one with an enum and a bounded string: the tool checks'.
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city now.",
        "parameters": {"type": "object", "additionalProperties": False,
                       "required": ["city", "unit"],
                       "properties": {"city": {"type": "string", "maxLength": 32},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {
        "name": "add", "description": "The sum of two integers.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["a", "b"],
                       "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
]
SCHEMAS: dict[str, dict[str, Any]] = {
    t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
CITY: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["city", "population"],
    "properties": {"city": {"type": "string", "maxLength": 24},
                   "population": {"type": "integer", "minimum": 0, "maximum": 100_000_000}}}
#: The anthropic client has no sampling parameters; the API's temperature
#: goes in the body.
GREEDY = {"temperature": 0}
HELLO = [{"role": "user", "content": "What is the capital of France?"}]


class Failed(Exception):
    """An expectation a server did not meet; its message is the reason."""


def need(condition: Any, reason: str) -> None:
    if not condition:
        raise Failed(reason)


@dataclass(frozen=True)
class Result:
    feature: str
    ok: bool
    reason: str
    latency_ms: float


@dataclass(frozen=True)
class Clients:
    openai: Any
    anthropic: Any | None


Body = Callable[[Any, Any | None, str], str]


@dataclass(frozen=True)
class Check:
    """A named feature check. Its body returns a one-line note on success
    and raises on failure; calling the Check never raises."""

    name: str
    body: Body

    def __call__(self, openai_client: Any, anthropic_client: Any | None,
                 model: str) -> Result:
        start = time.perf_counter()
        try:
            note = self.body(openai_client, anthropic_client, model)
            ok = True
        except Failed as failed:
            ok, note = False, str(failed)
        except Exception as error:  # a fail, never an escape: the reason says what
            ok, note = False, f"{type(error).__name__}: {error}"
        latency = (time.perf_counter() - start) * 1000
        return Result(self.name, ok, " ".join(note.split())[:160], latency)


CHECKS: list[Check] = []


def check(name: str) -> Callable[[Body], Body]:
    def register(body: Body) -> Body:
        CHECKS.append(Check(name, body))
        return body
    return register


def _valid_call(name: str, arguments: str | dict[str, Any], only: str | None = None) -> None:
    import jsonschema

    need(name in SCHEMAS, f"undeclared function {name!r}")
    need(only is None or name == only, f"called {name!r}, not {only!r}")
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    try:
        jsonschema.validate(value, SCHEMAS[name])
    except jsonschema.ValidationError as error:
        raise Failed(f"arguments {value} invalid: {error.message}") from None


def _anthropic(client: Any | None) -> Any:
    need(client is not None, "no anthropic client")
    return client


# Chat completions ------------------------------------------------------------


@check("models list")
def models_list(client: Any, _: Any, model: str) -> str:
    ids = [m.id for m in client.models.list()]
    need(model in ids, f"{model!r} not in {ids[:5]}")
    return f"{len(ids)} models"


@check("chat")
def chat(client: Any, _: Any, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=HELLO, max_tokens=16,
                                            temperature=0)
    choice = answer.choices[0]
    need(answer.object == "chat.completion", f"object {answer.object!r}")
    need(choice.message.role == "assistant" and choice.message.content, "no assistant text")
    need(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
    return repr(choice.message.content[:40])


@check("chat streaming")
def chat_streaming(client: Any, _: Any, model: str) -> str:
    chunks = list(client.chat.completions.create(model=model, messages=HELLO, max_tokens=16,
                                                 temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    need(len(chunks) > 1 and text, f"{len(chunks)} chunks, text {text!r}")
    need(chunks[-1].choices and chunks[-1].choices[0].finish_reason,
         "no finish_reason on the last chunk")
    return f"{len(chunks)} chunks"


@check("stream_options.include_usage")
def include_usage(client: Any, _: Any, model: str) -> str:
    chunks = list(client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    last = chunks[-1]
    need(last.usage is not None, "no usage on the last chunk")
    need(last.choices == [], f"the usage chunk has {len(last.choices)} choices, not none")
    need(all(c.usage is None for c in chunks[:-1]), "usage before the last chunk")
    return f"completion_tokens {last.usage.completion_tokens}"


@check("usage counts")
def usage_counts(client: Any, _: Any, model: str) -> str:
    usage = client.chat.completions.create(model=model, messages=HELLO, max_tokens=8,
                                           temperature=0).usage
    need(usage is not None, "no usage")
    need(usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 8,
         f"prompt {usage.prompt_tokens}, completion {usage.completion_tokens}")
    need(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, "total != sum")
    return f"{usage.prompt_tokens} + {usage.completion_tokens}"


@check("stop")
def stop(client: Any, _: Any, model: str) -> str:
    asked = [{"role": "user", "content": "Count from one to ten in words, with commas."}]
    whole = client.chat.completions.create(model=model, messages=asked, max_tokens=32,
                                           temperature=0).choices[0].message.content or ""
    need(len(whole) >= 6, f"too short an answer to stop in: {whole!r}")
    word = whole[len(whole) // 2:len(whole) // 2 + 2]  # a stop string from its middle
    cut = client.chat.completions.create(model=model, messages=asked, max_tokens=32,
                                         temperature=0, stop=[word]).choices[0]
    text = cut.message.content or ""
    need(word not in text, f"{word!r} still in {text!r}")
    need(cut.finish_reason == "stop", f"finish_reason {cut.finish_reason}")
    need(len(text) < len(whole), "not shorter than the answer without stop")
    return f"stopped before {word!r}"


@check("seed")
def seed(client: Any, _: Any, model: str) -> str:
    asked = [{"role": "user", "content": "Tell me something about cats."}]
    texts = [client.chat.completions.create(model=model, messages=asked, max_tokens=16,
                                            temperature=1.0, seed=1234)
             .choices[0].message.content for _ in range(2)]
    need(texts[0] and texts[0] == texts[1], f"{texts[0]!r} != {texts[1]!r}")
    return "same text twice at temperature 1"


@check("max_tokens -> length")
def max_tokens_length(client: Any, _: Any, model: str) -> str:
    answer = client.chat.completions.create(
        model=model, max_tokens=3, temperature=0,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}])
    need(answer.choices[0].finish_reason == "length",
         f"finish_reason {answer.choices[0].finish_reason}")
    need(answer.usage is None or answer.usage.completion_tokens == 3,
         f"completion_tokens {answer.usage and answer.usage.completion_tokens}")
    return "length at 3 tokens"


@check("n=2")
def n_two(client: Any, _: Any, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=HELLO, n=2, max_tokens=8,
                                            temperature=1.0, seed=7)
    need([c.index for c in answer.choices] == [0, 1],
         f"choices {[c.index for c in answer.choices]}")
    need(all(c.message.content for c in answer.choices), "a choice without text")
    return "2 choices"


@check("logprobs + top_logprobs")
def logprobs(client: Any, _: Any, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=HELLO, max_tokens=6,
                                            temperature=0, logprobs=True, top_logprobs=2)
    choice = answer.choices[0]
    content: list[Any] = (choice.logprobs.content if choice.logprobs else None) or []
    need(content, "no logprobs.content")
    need(all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in content),
         "a logprob > 0 or not 2 top_logprobs")
    need("".join(e.token for e in content) == choice.message.content,
         "tokens do not join to the text")
    return f"{len(content)} tokens"


@check("json_object")
def json_object(client: Any, _: Any, model: str) -> str:
    answer = client.chat.completions.create(
        model=model, max_tokens=96, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give a JSON object with a cat's name."}])
    choice = answer.choices[0]
    text = choice.message.content or ""
    if choice.finish_reason == "length":  # no bound on its length: the start of one
        need(text.lstrip().startswith("{"), f"cut, and not an object: {text[:40]!r}")
        return "cut by max_tokens, an object begun"
    need(isinstance(json.loads(text), dict), f"not an object: {text[:40]!r}")
    return "an object"


@check("json_schema strict")
def json_schema(client: Any, _: Any, model: str) -> str:
    import jsonschema

    for attempt in range(3):
        text = client.chat.completions.create(
            model=model, max_tokens=64, temperature=1.0, seed=attempt,
            messages=[{"role": "user", "content": "Name a large city and its population."}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "city", "strict": True, "schema": CITY}}).choices[0].message.content
        try:
            jsonschema.validate(json.loads(text or ""), CITY)
        except (ValueError, jsonschema.ValidationError) as error:
            raise Failed(f"try {attempt}: {text!r}: {error}") from None
    return "3 of 3 valid at temperature 1"


@check("parse (pydantic)")
def parse(client: Any, _: Any, model: str) -> str:
    import pydantic

    class City(pydantic.BaseModel):
        city: str
        population: int

    completions = client.chat.completions
    parser = completions.parse if hasattr(completions, "parse") else \
        client.beta.chat.completions.parse
    answer = parser(model=model, max_tokens=64, temperature=0, response_format=City,
                    messages=[{"role": "user", "content": "Name a large city and its "
                               "population."}])
    parsed = answer.choices[0].message.parsed
    need(isinstance(parsed, City), f"parsed {parsed!r}")
    return f"{parsed.city!r}"


# Tools -------------------------------------------------------------------------


def _calls(answer: Any) -> list[Any]:
    choice = answer.choices[0]
    return list(choice.message.tool_calls or [])


@check("tools auto")
def tools_auto(client: Any, _: Any, model: str) -> str:
    choice = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                            tool_choice="auto", temperature=0,
                                            max_tokens=96).choices[0]
    if choice.finish_reason == "tool_calls":
        need(choice.message.tool_calls, "finish_reason tool_calls without calls")
        for call in choice.message.tool_calls:
            _valid_call(call.function.name, call.function.arguments)
        return f"{len(choice.message.tool_calls)} call(s)"
    need(not choice.message.tool_calls, f"calls with finish_reason {choice.finish_reason}")
    need(isinstance(choice.message.content, str), "neither calls nor text")
    return "answered in text"


@check("tools required")
def tools_required(client: Any, _: Any, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                            tool_choice="required", temperature=0,
                                            max_tokens=96)
    calls = _calls(answer)
    need(answer.choices[0].finish_reason == "tool_calls" and calls,
         f"finish_reason {answer.choices[0].finish_reason}, {len(calls)} calls")
    for call in calls:
        _valid_call(call.function.name, call.function.arguments)
    return f"{len(calls)} valid call(s)"


@check("tools named function")
def tools_named(client: Any, _: Any, model: str) -> str:
    calls = _calls(client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, max_tokens=64, temperature=0,
        tool_choice={"type": "function", "function": {"name": "add"}}))
    need(len(calls) == 1, f"{len(calls)} calls")
    _valid_call(calls[0].function.name, calls[0].function.arguments, only="add")
    return "one valid call of add"


@check("parallel_tool_calls false")
def parallel_false(client: Any, _: Any, model: str) -> str:
    counts = []
    for attempt in range(3):
        calls = _calls(client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, temperature=1.0, seed=attempt, max_tokens=128))
        counts.append(len(calls))
    need(all(c == 1 for c in counts), f"calls per answer {counts}")
    return "one call in each of 3"


@check("tool result back")
def tool_result(client: Any, _: Any, model: str) -> str:
    back = [*ASK,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"}]
    answer = client.chat.completions.create(model=model, messages=back, tools=TOOLS,
                                            tool_choice="none", max_tokens=24, temperature=0)
    choice = answer.choices[0]
    need(choice.message.content, f"no text (finish_reason {choice.finish_reason})")
    return repr(choice.message.content[:40])


# Completions, embeddings, errors -----------------------------------------------


@check("completions (legacy)")
def completions(client: Any, _: Any, model: str) -> str:
    answer = client.completions.create(model=model, prompt="One, two,", max_tokens=6,
                                       temperature=0)
    need(answer.object == "text_completion", f"object {answer.object!r}")
    need(answer.choices[0].text, "no text")
    return repr(answer.choices[0].text[:40])


@check("embeddings float")
def embeddings_float(client: Any, _: Any, model: str) -> str:
    data = client.embeddings.create(model=model, input=["a cat", "a dog"],
                                    encoding_format="float").data
    need([d.index for d in data] == [0, 1], f"indexes {[d.index for d in data]}")
    kinds = sorted({type(x).__name__ for x in data[0].embedding})
    need(kinds == ["float"], f"a vector of {kinds}, not of floats")
    need(len(data[0].embedding) == len(data[1].embedding) > 16, "not two vectors of one size")
    return f"{len(data[0].embedding)} dimensions"


@check("embeddings base64")
def embeddings_base64(client: Any, _: Any, model: str) -> str:
    # Asked for explicitly, the client hands back what the server sent.
    encoded = client.embeddings.create(model=model, input="a cat",
                                       encoding_format="base64").data[0].embedding
    need(isinstance(encoded, str), f"not base64 text but {type(encoded).__name__}")
    raw = base64.b64decode(encoded)
    vector = struct.unpack(f"<{len(raw) // 4}f", raw)
    floats = client.embeddings.create(model=model, input="a cat",
                                      encoding_format="float").data[0].embedding
    need(len(vector) == len(floats), f"{len(vector)} != {len(floats)} dimensions")
    need(all(abs(a - b) < 1e-4 for a, b in zip(vector, floats, strict=True)),
         "not the float vector")
    return f"{len(vector)} float32"


@check("error: unknown model -> 404")
def unknown_model(client: Any, _: Any, model: str) -> str:
    import openai

    try:
        client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2)
    except openai.NotFoundError:
        return "NotFoundError"
    raise Failed("answered 200")


@check("error: bad parameter -> 400")
def bad_parameter(client: Any, _: Any, model: str) -> str:
    import openai

    try:
        client.chat.completions.create(model=model, max_tokens=2,
                                       messages=[{"role": "wizard", "content": "hi"}])
    except openai.BadRequestError:
        return "BadRequestError"
    raise Failed("answered 200 to role 'wizard'")


# Responses -----------------------------------------------------------------------


@check("responses create")
def responses_create(client: Any, _: Any, model: str) -> str:
    answer = client.responses.create(model=model, input="Say hello.", max_output_tokens=16,
                                     temperature=0)
    need(answer.id and answer.output_text, "no id or no output_text")
    return repr(answer.output_text[:40])


@check("responses previous_response_id")
def responses_previous(client: Any, _: Any, model: str) -> str:
    first = client.responses.create(model=model, input="My name is Ada. Say hello.",
                                    max_output_tokens=12, temperature=0)
    second = client.responses.create(model=model, previous_response_id=first.id,
                                     input="What is my name?", max_output_tokens=12,
                                     temperature=0)
    need(second.previous_response_id == first.id and second.output_text,
         "not continued")
    need(second.usage.input_tokens > first.usage.input_tokens,
         f"input_tokens {second.usage.input_tokens} <= {first.usage.input_tokens}")
    return f"input_tokens {first.usage.input_tokens} -> {second.usage.input_tokens}"


@check("responses streaming")
def responses_streaming(client: Any, _: Any, model: str) -> str:
    with client.responses.stream(model=model, input="Count from one to five.",
                                 max_output_tokens=16, temperature=0) as stream:
        events = list(stream)
    need(events and events[-1].type in ("response.completed", "response.incomplete"),
         "no completed event")
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    need(len(deltas) > 1 and "".join(deltas) == events[-1].response.output_text,
         "deltas do not make the final text")
    return f"{len(events)} events"


@check("rerank")
def rerank(client: Any, _: Any, model: str) -> str:
    import httpx

    query = "How do I restart a failed systemd service?"
    documents = ["Bananas are rich in potassium.", query,
                 "The stock market closed higher on Friday."]
    response = httpx.post(f"{str(client.base_url).rstrip('/')}/rerank", timeout=120,
                          json={"model": model, "query": query, "documents": documents,
                                "top_n": 2})
    need(response.status_code == 200, f"HTTP {response.status_code} on POST /v1/rerank")
    results = response.json()["results"]
    need(len(results) == 2 and results[0]["index"] == 1,
         f"results {[(r['index'], r['relevance_score']) for r in results]}")
    return f"top score {results[0]['relevance_score']:.3f}"


# Anthropic Messages ------------------------------------------------------------


@check("anthropic messages")
def anthropic_messages(_: Any, anthropic_client: Any | None, model: str) -> str:
    message = _anthropic(anthropic_client).messages.create(
        model=model, max_tokens=16, extra_body=GREEDY, system="You answer briefly.",
        messages=HELLO)
    need(message.type == "message" and [b.type for b in message.content] == ["text"],
         f"content {[b.type for b in message.content]}")
    need(message.stop_reason in ("end_turn", "max_tokens"), f"stop {message.stop_reason}")
    need(message.usage.output_tokens > 0, "no usage")
    return repr(message.content[0].text[:40])


@check("anthropic streaming")
def anthropic_streaming(_: Any, anthropic_client: Any | None, model: str) -> str:
    with _anthropic(anthropic_client).messages.stream(
            model=model, max_tokens=16, extra_body=GREEDY,
            messages=[{"role": "user", "content": "Count from one to five."}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    need(len(pieces) > 1 and "".join(pieces) == final.content[0].text,
         "pieces do not make the final text")
    return f"{len(pieces)} pieces"


@check("anthropic tool_use")
def anthropic_tool_use(_: Any, anthropic_client: Any | None, model: str) -> str:
    client = _anthropic(anthropic_client)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    called = client.messages.create(model=model, max_tokens=64, tools=tools,
                                    extra_body=GREEDY, messages=ASK,
                                    tool_choice={"type": "tool", "name": "get_weather"})
    uses = [block for block in called.content if block.type == "tool_use"]
    need(called.stop_reason == "tool_use" and len(uses) == 1,
         f"stop {called.stop_reason}, {len(uses)} tool_use")
    _valid_call(uses[0].name, uses[0].input, only="get_weather")
    answered = client.messages.create(
        model=model, max_tokens=24, tools=tools, extra_body=GREEDY,
        tool_choice={"type": "none"},
        messages=[*ASK, {"role": "assistant", "content": called.content},
                  {"role": "user", "content": [{"type": "tool_result",
                                                "tool_use_id": uses[0].id,
                                                "content": "Rain, 4 degrees."}]}])
    need(any(b.type == "text" for b in answered.content), "no text after the result")
    return "tool_use, then text after its result"


# Running -----------------------------------------------------------------------


def clients(base_url: str, timeout: float = 120) -> Clients:
    """The official clients on `base_url` (with or without its /v1); the
    anthropic one is None where it is not installed."""
    import openai

    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        import anthropic
    except ImportError:
        second = None
    else:
        second = anthropic.Anthropic(base_url=root, api_key="unused", timeout=timeout,
                                     max_retries=0)
    return Clients(openai.OpenAI(base_url=f"{root}/v1", api_key="unused", timeout=timeout,
                                 max_retries=0), second)


def run(name: str, on: Clients, model: str) -> Result:
    chosen = next(c for c in CHECKS if c.name == name)
    return chosen(on.openai, on.anthropic, model)


def run_all(on: Clients, model: str) -> list[Result]:
    return [c(on.openai, on.anthropic, model) for c in CHECKS]
