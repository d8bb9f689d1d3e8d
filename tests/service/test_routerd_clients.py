"""routerd against two more real clients, unmodified, on runtimed's SmolLM2:
litellm (`completion`, `acompletion`) and langchain-openai (`ChatOpenAI`).
Each does a plain answer, a tool-calling loop (a forced call whose arguments
are valid against the declared schema, its result sent back, a text answer)
and structured output (a JSON Schema answer that validates).

No network: litellm fetches its model cost map at import unless told to use
its bundled copy (LITELLM_LOCAL_MODEL_COST_MAP, set before it is imported),
and every test fails if anything looks up or connects to a host other than
the loopback one."""

import asyncio
import importlib.util
import inspect
import json
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.models import require_llama, router_node

require_llama()
for _client in ("litellm", "langchain_openai"):
    if importlib.util.find_spec(_client) is None:
        pytest.skip(f"{_client} is not installed (pip install -e '.[test]')",
                    allow_module_level=True)

# Read by litellm at import: its bundled cost map (and tokenizers), no fetch.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LITELLM_OFFLINE_MODE"] = "true"

# litellm's response types are TypedDicts with ReadOnly items (its thinking
# blocks); pydantic warns, in its own module, when it builds their schema on
# litellm's first streamed chunk. Nothing of routerd's.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Items? .* on TypedDict class '\\w+' (is|are) using the `ReadOnly` qualifier"
    ":UserWarning:pydantic._internal._generate_schema")

LOOPBACK = {"127.0.0.1", "::1", "localhost"}

TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "additionalProperties": False,
                   "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 32},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
SCHEMA = TOOL["function"]["parameters"]
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
RESULT = "4 degrees, rain"
CITY = {"type": "object", "additionalProperties": False,
        "required": ["city", "population"],
        "properties": {"city": {"type": "string", "maxLength": 24},
                       "population": {"type": "integer", "minimum": 0,
                                      "maximum": 100_000_000}}}
NAME_A_CITY = [{"role": "user", "content": "Name a large city and its population."}]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """routerd in front of runtimed's SmolLM2 (as test_routerd_openai.py's
    node): its loopback /v1 URL."""
    with router_node(tmp_path_factory.mktemp("routerd-clients")) as port:
        yield f"http://127.0.0.1:{port}/v1"
        _close_litellm_clients()


def _close_litellm_clients() -> None:
    """litellm keeps its OpenAI clients (and their keep-alive connections)
    for the process's life; closed here, not left to an unclosed-socket
    ResourceWarning at exit. Its async ones are closed where they ran."""
    for close in _litellm_closes():
        if not inspect.iscoroutinefunction(close):
            close()


def _litellm_closes() -> list[Any]:
    """The close methods of litellm's cached clients."""
    if "litellm" not in sys.modules:
        return []
    import litellm

    clients = litellm.in_memory_llm_clients_cache.cache_dict.values()
    return [close for client in list(clients)
            if callable(close := getattr(client, "close", None))]


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every name looked up and every address connected to during a test
    (any thread: telemetry, cost maps, tokenizers) is the loopback host's."""
    elsewhere: list[str] = []
    lookup, connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, bytes):
            host = host.decode()
        if host not in LOOPBACK:
            elsewhere.append(f"lookup {host}")
        return lookup(host, *args, **kwargs)

    def connect_to(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOOPBACK:
            elsewhere.append(f"connect {address}")
        connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect_to)
    yield
    assert elsewhere == []


def _valid_arguments(arguments: str | dict[str, Any]) -> dict[str, Any]:
    import jsonschema

    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(value, SCHEMA)
    assert isinstance(value, dict)
    return value


# litellm ---------------------------------------------------------------------


def _litellm(base_url: str, **kwargs: Any) -> Any:
    import litellm

    return litellm.completion(model="openai/smollm2", api_base=base_url, api_key="unused",
                              timeout=120, max_retries=0, **kwargs)


def test_litellm_answers(base_url: str) -> None:
    answer = _litellm(base_url, messages=[{"role": "user", "content": "Say hello."}],
                      max_tokens=16, temperature=0)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert answer.usage.completion_tokens > 0


def test_litellm_tool_calling_loop(base_url: str) -> None:
    """A forced call with schema-valid arguments; its result sent back; a
    text answer that read it (its prompt is longer than the question's
    alone by the call and the result)."""
    called = _litellm(base_url, messages=ASK, tools=[TOOL], max_tokens=64,
                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and len(calls) == 1 and calls[0].function.name == "get_weather"
    _valid_arguments(calls[0].function.arguments)
    back = [*ASK,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0].id, "type": "function", "function": {
                    "name": "get_weather", "arguments": calls[0].function.arguments}}]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": RESULT}]
    answer = _litellm(base_url, messages=back, tools=[TOOL], tool_choice="none",
                      max_tokens=32, temperature=0)
    message = answer.choices[0].message
    assert not message.tool_calls
    assert isinstance(message.content, str) and message.content.strip()
    asked = _litellm(base_url, messages=ASK, tools=[TOOL], tool_choice="none", max_tokens=1)
    assert answer.usage.prompt_tokens > asked.usage.prompt_tokens


def test_litellm_structured_output(base_url: str) -> None:
    import jsonschema

    for seed in range(3):
        answer = _litellm(base_url, messages=NAME_A_CITY, max_tokens=64, temperature=1.0,
                          seed=seed, response_format={"type": "json_schema", "json_schema": {
                              "name": "city", "strict": True, "schema": CITY}})
        jsonschema.validate(json.loads(answer.choices[0].message.content), CITY)


def test_litellm_acompletion_streams_text(base_url: str) -> None:
    import litellm

    async def main() -> list[str]:
        try:
            stream = await litellm.acompletion(
                model="openai/smollm2", api_base=base_url, api_key="unused", timeout=120,
                max_retries=0, stream=True, max_tokens=16, temperature=0,
                messages=[{"role": "user", "content": "Count from one to five."}])
            return [chunk.choices[0].delta.content or "" async for chunk in stream
                    if chunk.choices]
        finally:
            for close in _litellm_closes():
                if inspect.iscoroutinefunction(close):
                    await close()

    pieces = asyncio.run(main())
    assert len([p for p in pieces if p]) > 1  # more than one chunk carried text
    whole = _litellm(base_url, max_tokens=16, temperature=0,
                     messages=[{"role": "user", "content": "Count from one to five."}])
    assert "".join(pieces) == whole.choices[0].message.content


# langchain-openai ------------------------------------------------------------


def _chat(base_url: str, **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    return ChatOpenAI(model="smollm2", base_url=base_url, api_key=SecretStr("unused"),
                      temperature=0, timeout=120, max_retries=0, **kwargs)


def test_langchain_invoke(base_url: str) -> None:
    from langchain_core.messages import AIMessage

    answer = _chat(base_url, max_tokens=16).invoke("Say hello.")
    assert isinstance(answer, AIMessage) and not answer.tool_calls
    assert isinstance(answer.content, str) and answer.content.strip()
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] > 0


def test_langchain_tool_calling_loop(base_url: str) -> None:
    """bind_tools with the tool forced: a call with schema-valid arguments;
    a ToolMessage back (the tool not forced any more): a text answer that
    read it."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    chat = _chat(base_url, max_tokens=64)
    messages: list[Any] = [HumanMessage(ASK[0]["content"])]
    called = chat.bind_tools([TOOL], tool_choice="get_weather").invoke(messages)
    assert isinstance(called, AIMessage) and len(called.tool_calls) == 1
    call = called.tool_calls[0]
    assert call["name"] == "get_weather" and call["id"]
    _valid_arguments(call["args"])
    messages += [called, ToolMessage(RESULT, tool_call_id=call["id"])]
    unforced = chat.bind_tools([TOOL], tool_choice="none")
    answer = unforced.invoke(messages)
    assert isinstance(answer, AIMessage) and not answer.tool_calls
    assert isinstance(answer.content, str) and answer.content.strip()
    asked = unforced.invoke(messages[:1], max_tokens=1)
    assert answer.usage_metadata is not None and asked.usage_metadata is not None
    assert answer.usage_metadata["input_tokens"] > asked.usage_metadata["input_tokens"]


def test_langchain_structured_output(base_url: str) -> None:
    from pydantic import BaseModel, ConfigDict, Field

    class City(BaseModel):
        model_config = ConfigDict(extra="forbid")
        city: str = Field(max_length=24)
        population: int = Field(ge=0, le=100_000_000)

    structured = _chat(base_url, max_tokens=64).with_structured_output(
        City, method="json_schema", include_raw=True)
    result = structured.invoke(NAME_A_CITY[0]["content"])
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], City) and result["parsed"].city
    assert City.model_validate_json(result["raw"].content) == result["parsed"]
