"""reasoning_effort over routerd's OpenAI surface, for real: routerd in
front of runtimed and modeld, socket-activated. A model that thinks (the
tiny GGUF the tests write, whose vocabulary has <think> and </think>) gets
a thinking budget from the effort, and its thinking comes back apart, as
reasoning_content, in a whole answer and in a stream; a model that does not
think (SmolLM2) is a 400 naming the field, never silently ignored."""

import hashlib
import http.client
import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import varlink

from tests import tinymodel
from tests.models import model_node, register, require_llama
from tests.support import activated

require_llama()

#: The answer begun with <think>: the model's output starts thinking.
THINKING = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>"}]


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    root = tmp_path_factory.mktemp("routerd-reasoning")
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "routerd.toml").write_text(
        '[http]\nlisten = ["127.0.0.1:0"]\n[[providers]]\nid = "local"\nkind = "runtimed"\n'
        'models = ["smollm2", "tiny"]\ntimeout = 120\n')
    tiny = tinymodel.build(tmp_path_factory, "Q8_0")
    with ExitStack() as stack, model_node(root, stack):
        register(root, "tiny", tiny, hashlib.sha256(tiny.read_bytes()).hexdigest())
        daemon = stack.enter_context(activated("routerd", root))
        with varlink.Client(address=daemon.address) as client, \
                client.open("io.syntrop.Router1") as router:
            ingress = router.GetStatus()["ingress"]
        port = next(int(a.rpartition(":")[2]) for a in ingress if a.startswith("127.0.0.1:"))
        # runtimed starts on its first connection: here, not inside a test.
        assert post(port, {"model": "tiny", "max_tokens": 1,
                           "messages": [{"role": "user", "content": "a"}]})[0] == 200
        yield port


def post(port: int, body: dict[str, Any]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", "/v1/chat/completions", body=json.dumps(body),
                       headers={"content-type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def chat(effort: str, **more: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": THINKING, "continue_final_message": True,
            "reasoning_effort": effort, "max_tokens": 300, "temperature": 1.0, "seed": 3,
            **more}


def test_a_thinking_models_reasoning_comes_apart_from_its_answer(port: int) -> None:
    status, data = post(port, chat("low"))  # at most 256 thinking tokens
    assert status == 200, data
    message = json.loads(data)["choices"][0]["message"]
    assert message["reasoning_content"], message
    for text in (message["reasoning_content"], message["content"]):
        assert "<think>" not in text and "</think>" not in text, message


def test_the_same_in_a_stream_thinking_first(port: int) -> None:
    status, data = post(port, chat("low", stream=True))
    assert status == 200, data
    deltas = [json.loads(line[6:])["choices"][0]["delta"]
              for line in data.decode().splitlines()
              if line.startswith("data: {") and '"choices": [{' in line]
    kinds = ["reasoning" if "reasoning_content" in d else "answer" if d.get("content") else ""
             for d in deltas]
    kinds = [k for k in kinds if k]
    assert kinds and kinds[0] == "reasoning", kinds
    answering = kinds.index("answer") if "answer" in kinds else len(kinds)
    assert "reasoning" not in kinds[answering:], kinds  # it never thinks again


def test_no_thinking_at_all_when_the_effort_is_minimal(port: int) -> None:
    status, data = post(port, chat("minimal"))
    assert status == 200, data
    assert not json.loads(data)["choices"][0]["message"].get("reasoning_content")


def test_a_model_that_does_not_think_is_a_400_naming_the_field(port: int) -> None:
    status, data = post(port, {"model": "smollm2", "reasoning_effort": "high",
                               "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 400, data
    assert "reasoning_effort" in json.loads(data)["error"]["message"], data
    status, data = post(port, {"model": "smollm2", "reasoning_effort": "extreme",
                               "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 400 and b"reasoning_effort" in data, data
