"""A provider killed mid-stream: routerd continues the same SSE stream from
the next provider, replaying the prompt with the text already sent, so the
client's stream is complete and coherent (no token lost or repeated).

The upstreams are real processes serving OpenAI-style HTTP on loopback:
this module run as a script (`python -m tests.service.test_routerd_failover
MODE LOG` from the checkout).
"primary" streams a few words of ANSWER then stalls until the test kills
it with SIGKILL; "backup" answers the rest of ANSWER after the text the
replayed request already holds; both log each request body to LOG.
"""

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", "."]
ANSWER = "".join(WORDS)
PROMPT = "Tell me about the fox."
#: Words the primary sends before it stalls.
SENT = 3


# the upstream processes ----------------------------------------------------


def _chunk(endpoint: str, text: str, ident: str, role: bool = False,
           finish: str | None = None) -> dict[str, Any]:
    if endpoint.endswith("/chat/completions"):
        delta: dict[str, Any] = {"content": text}
        if role:
            delta["role"] = "assistant"
        return {"id": ident, "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return {"id": ident, "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


async def _serve(mode: str, log: Path, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    import h11

    from tests.upstreams import read_request

    conn = h11.Connection(h11.SERVER)
    while True:
        got = await read_request(conn, reader)
        if got is None:
            return
        request, body = got
        decoded = json.loads(body)
        with log.open("a") as out:
            out.write(json.dumps({"mode": mode, "path": request.target.decode(),
                                  "body": decoded}) + "\n")
        endpoint = request.target.decode()
        writer.write(conn.send(h11.Response(status_code=200, headers=[
            ("content-type", "text/event-stream")])) or b"")
        tools = decoded.get("tools")
        if mode == "primary":
            ident = f"{mode}-1"
            if tools:
                call = {"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "look", "arguments": ""}}
                chunk = {"id": ident, "object": "chat.completion.chunk", "created": 1,
                         "model": "m", "choices": [{"index": 0, "finish_reason": None,
                                                    "delta": {"role": "assistant",
                                                              "tool_calls": [call]}}]}
                writer.write(conn.send(h11.Data(data=f"data: {json.dumps(chunk)}\n\n".encode()))
                             or b"")
            for index, word in enumerate(WORDS[:SENT]):
                payload = json.dumps(_chunk(endpoint, word, ident, role=index == 0))
                writer.write(conn.send(h11.Data(data=f"data: {payload}\n\n".encode())) or b"")
            # Half an event, then silence: the test kills this process now.
            writer.write(conn.send(h11.Data(data=b'data: {"id": "primary-1", "obj')) or b"")
            await writer.drain()
            await asyncio.sleep(3600)
        # backup: the rest of ANSWER after what the replayed request holds.
        if endpoint.endswith("/chat/completions"):
            last = decoded["messages"][-1]
            done = last["content"] if last["role"] == "assistant" else ""
        else:
            done = decoded["prompt"][len(PROMPT):]
        rest, taken = [], ""
        for word in WORDS:
            if len(taken) >= len(done):
                rest.append(word)
            taken += word
        assert taken.startswith(done) and "".join(WORDS)[:len(done)] == done
        ident = f"{mode}-1"
        for index, word in enumerate(rest):
            finish = "stop" if index == len(rest) - 1 else None
            payload = json.dumps(_chunk(endpoint, word, ident, role=index == 0, finish=finish))
            writer.write(conn.send(h11.Data(data=f"data: {payload}\n\n".encode())) or b"")
        writer.write((conn.send(h11.Data(data=b"data: [DONE]\n\n")) or b"")
                     + (conn.send(h11.EndOfMessage()) or b""))
        await writer.drain()
        conn.start_next_cycle()


async def _main(mode: str, log: Path) -> None:
    server = await asyncio.start_server(
        lambda r, w: _serve(mode, log, r, w), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], Path(sys.argv[2])))
    raise SystemExit(0)


# the tests -------------------------------------------------------------------

import http.client  # noqa: E402
import importlib.util  # noqa: E402

import pytest  # noqa: E402
import varlink  # noqa: E402

from tests.support import activated  # noqa: E402


@contextmanager
def _upstream(mode: str, log: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    process = subprocess.Popen([sys.executable, "-m", "tests.service.test_routerd_failover",
                                mode, str(log)], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[2])
    try:
        assert process.stdout is not None
        yield process, int(process.stdout.readline())
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


class Node:
    def __init__(self, root: Path, stack: ExitStack) -> None:
        self.log = root / "requests.log"
        self.primary, primary = stack.enter_context(_upstream("primary", self.log))
        _, backup = stack.enter_context(_upstream("backup", self.log))
        (root / "config").mkdir(parents=True, exist_ok=True)
        (root / "config" / "routerd.toml").write_text(f"""
[http]
listen = ["127.0.0.1:0"]
[[providers]]
id = "primary"
kind = "openai"
tier = "local"
endpoint = "http://127.0.0.1:{primary}/v1"
models = ["m"]
[[providers]]
id = "backup"
kind = "openai"
tier = "lan"
endpoint = "http://127.0.0.1:{backup}/v1"
models = ["m"]
""")
        daemon = stack.enter_context(activated("routerd", root))
        client = varlink.Client(address=daemon.address)
        with client.open("io.syntrop.Router1") as router:
            ingress = router.GetStatus()["ingress"]
            self.candidates = router.Route(model="m")["candidates"]
        client.cleanup()
        self.port = next(int(a.rpartition(":")[2]) for a in ingress
                         if a.startswith("127.0.0.1:"))

    def kill_primary(self) -> None:
        self.primary.send_signal(signal.SIGKILL)
        self.primary.wait()

    def requests(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with ExitStack() as stack:
        yield Node(tmp_path, stack)


def test_primary_is_chosen_first(node: Node) -> None:
    assert [c["provider"] for c in node.candidates] == ["primary", "backup"]


def test_openai_client_stream_survives_a_killed_provider(node: Node) -> None:
    if importlib.util.find_spec("openai") is None:
        pytest.skip("the openai client is not installed")
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{node.port}/v1", api_key="unused",
                           max_retries=0, timeout=30)
    stream = client.chat.completions.create(
        model="m", stream=True, max_tokens=50,
        messages=[{"role": "user", "content": PROMPT}])
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == SENT:
            node.kill_primary()  # mid-stream, half an event in flight
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == ANSWER  # every word once, in order
    assert {c.id for c in chunks} == {"primary-1"}
    assert [c.choices[0].delta.role for c in chunks].count("assistant") == 1
    assert chunks[-1].choices[0].finish_reason == "stop"
    replayed = [r for r in node.requests() if r["mode"] == "backup"]
    assert len(replayed) == 1
    body = replayed[0]["body"]
    assert body["messages"] == [{"role": "user", "content": PROMPT},
                                {"role": "assistant", "content": "".join(WORDS[:SENT])}]
    assert body["max_tokens"] == 50 - SENT


def _raw_stream(node: Node, path: str, body: dict[str, Any], kill_after: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    connection.request("POST", path, body=json.dumps(body),
                       headers={"content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    text, seen = "", 0
    while True:
        line = response.readline().decode()
        if not line:
            break
        text += line
        if line.startswith("data: "):
            seen += 1
            if seen == kill_after:
                node.kill_primary()
    connection.close()
    return text


def test_completion_stream_continues_with_a_comment(node: Node) -> None:
    text = _raw_stream(node, "/v1/completions",
                       {"model": "m", "prompt": PROMPT, "stream": True}, SENT)
    events = [e for e in text.split("\n\n") if e]
    comments = [e for e in events if e.startswith(":")]
    assert len(comments) == 1 and "primary failed mid-stream; continued on backup" in comments[0]
    data = [e[6:] for e in events if e.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == ANSWER
    assert {c["id"] for c in chunks} == {"primary-1"}
    replayed = [r for r in node.requests() if r["mode"] == "backup"]
    assert replayed[0]["body"]["prompt"] == PROMPT + "".join(WORDS[:SENT])


def test_tool_calls_are_never_replayed(node: Node) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": PROMPT}],
            "tools": [{"type": "function", "function": {"name": "look", "parameters": {}}}]}
    text = _raw_stream(node, "/v1/chat/completions", body, 1)
    data = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["code"] == "upstream_error"
    assert not [r for r in node.requests() if r["mode"] == "backup"]


def test_routerd_stays_up_and_marks_the_failure(node: Node) -> None:
    _raw_stream(node, "/v1/completions", {"model": "m", "prompt": PROMPT, "stream": True},
                SENT)
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    connection.request("GET", "/metrics")
    metrics = connection.getresponse().read().decode()
    connection.close()
    assert "routerd_stream_continuations_total 1" in metrics
    assert 'routerd_provider_attempts_total{provider="primary",outcome="failed"} 1' in metrics
    # The next request goes straight to the backup: the primary's breaker is open.
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    connection.request("POST", "/v1/completions", body=json.dumps(
        {"model": "m", "prompt": PROMPT, "stream": True}),
                       headers={"content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and b"data: [DONE]" in response.read()
    connection.close()
    modes = [r["mode"] for r in node.requests()]
    assert modes == ["primary", "backup", "backup"]
