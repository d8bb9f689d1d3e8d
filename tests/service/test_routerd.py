"""routerd for real: socket-activated, its HTTP ingress on a free loopback
port and a Unix socket, in front of loopback OpenAI-style upstreams this
test starts (good, failing with 500, sending garbage, hanging)."""

import asyncio
import contextlib
import http.client
import importlib.util
import json
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import varlink

from tests.models import model_node
from tests.support import Activated, activated
from tests.upstreams import openai_upstream as upstream

NAME = "io.syntrop.Router1"


# routerd -------------------------------------------------------------------


CONFIG = """
default_model = "m1"
[http]
listen = ["127.0.0.1:0", "unix:{root}/run/router.sock"]
max_body_bytes = 4096
header_timeout = 1
body_timeout = 1

[[providers]]
id = "broken"
kind = "openai"
tier = "local"
endpoint = "http://127.0.0.1:{port}/broken/v1"
models = ["m1"]

[[providers]]
id = "broken-stream"
kind = "openai"
tier = "local"
endpoint = "http://127.0.0.1:{port}/broken/v1"
models = ["s"]

[[providers]]
id = "good"
kind = "openai"
tier = "lan"
endpoint = "http://127.0.0.1:{port}/good/v1"
models = ["m1", "m2", "s"]
cost = 1

[[providers]]
id = "found"
kind = "openai"
endpoint = "http://127.0.0.1:{port}/found/v1"

[[providers]]
id = "garbage"
kind = "openai"
endpoint = "http://127.0.0.1:{port}/garbage/v1"
models = ["g"]

[[providers]]
id = "echo"
kind = "openai"
endpoint = "http://127.0.0.1:{port}/echo/v1"
models = ["e"]

[[providers]]
id = "hang"
kind = "openai"
endpoint = "http://127.0.0.1:{port}/hang/v1"
models = ["h"]
timeout = 0.5
"""


class Router:
    def __init__(self, address: str, pid: int) -> None:
        self.client = varlink.Client(address=address)
        self.iface = self.client.open(NAME)
        self.pid = pid
        status = self.iface.GetStatus()
        self.port = next(int(a.rpartition(":")[2]) for a in status["ingress"]
                         if a.startswith("127.0.0.1:"))

    def request(self, method: str, path: str, body: Any = None,
                raw: bytes | None = None, timeout: float = 10) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        payload = raw if raw is not None else (
            None if body is None else json.dumps(body).encode())
        connection.request(method, path, body=payload,
                           headers={"content-type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        connection.close()
        if response.getheader("content-type") == "text/event-stream":
            return response.status, data.decode()
        return response.status, json.loads(data)

    def close(self) -> None:
        self.iface.close()
        self.client.cleanup()

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def _routerd_pid(process_pid: int) -> int:
    """systemd-socket-activate execs the daemon: same pid."""
    return process_pid


@contextlib.contextmanager
def configured(root: Path, config: str) -> Iterator[Router]:
    """routerd socket-activated on `root`, its routerd.toml `config` with
    {root} and {port} (an OpenAI upstream on loopback) filled in."""
    with ExitStack() as stack:
        port = stack.enter_context(upstream())
        (root / "config").mkdir(parents=True, exist_ok=True)
        (root / "run").mkdir(parents=True, exist_ok=True)
        (root / "config" / "routerd.toml").write_text(config.format(root=root, port=port))
        daemon = stack.enter_context(activated("routerd", root))
        router = Router(daemon.address, _routerd_pid(daemon.process.pid))
        try:
            yield router
        finally:
            router.close()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with configured(tmp_path_factory.mktemp("routerd"), CONFIG) as router:
        yield router


def _chat_body(model: str | None = "m1", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], **extra}
    if model is not None:
        body["model"] = model
    return body


def test_chat_retries_past_a_provider_failing_before_the_first_token(router: Router) -> None:
    status, answer = router.request("POST", "/v1/chat/completions", _chat_body())
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "good answers"
    providers = {p["id"]: p for p in router.iface.ListProviders()["providers"]}
    assert providers["broken"]["status"] == "cooling"
    assert providers["good"]["status"] == "healthy"
    assert providers["good"]["latency_ms"] is not None


def test_streaming_chat_is_relayed_chunk_by_chunk(router: Router) -> None:
    status, text = router.request("POST", "/v1/chat/completions", _chat_body(stream=True))
    assert status == 200
    events = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    words = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert "".join(words) == "Hello, world"


def test_stream_retries_past_a_provider_failing_before_the_first_chunk(
        router: Router) -> None:
    status, text = router.request("POST", "/v1/chat/completions",
                                  _chat_body("s", stream=True))
    assert status == 200, text
    assert "Hello" in text and text.rstrip().endswith("data: [DONE]")
    providers = {p["id"]: p for p in router.iface.ListProviders()["providers"]}
    assert providers["broken-stream"]["status"] == "cooling"


def test_upstream_connections_are_reused(router: Router) -> None:
    for _ in range(3):
        assert router.request("POST", "/v1/completions", {"model": "m2", "prompt": "x"})[0] == 200
    fds = len(list(Path(f"/proc/{router.pid}/fd").iterdir()))
    for _ in range(20):
        assert router.request("POST", "/v1/completions", {"model": "m2", "prompt": "x"})[0] == 200
    assert len(list(Path(f"/proc/{router.pid}/fd").iterdir())) <= fds + 1


def test_default_model_and_completions(router: Router) -> None:
    status, answer = router.request("POST", "/v1/chat/completions", _chat_body(model=None))
    assert status == 200, answer
    status, answer = router.request("POST", "/v1/completions", {"model": "m2", "prompt": "x"})
    assert status == 200, answer


def test_models_list_configured_discovered_and_aliases(router: Router) -> None:
    status, answer = router.request("GET", "/v1/models")
    assert status == 200
    ids = [m["id"] for m in answer["data"]]
    assert ids[:4] == ["m1", "s", "m2", "discovered"]
    assert {"router:fast", "router:hard", "router:auto"} <= set(ids)
    models = router.iface.ListModels()
    assert models["default_model"] == "m1"
    status, answer = router.request("GET", "/health")
    assert (status, answer["status"]) == (200, "ok")


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    (b'{"model": "m1", "messages": "hi"}', 400, "invalid_value"),
    (b'{"model": "m1", "messages": [{"role": "user"}], "n": 0}', 400, "invalid_value"),
    (b'{"model": "nope", "messages": [{"role": "user"}]}', 404, "model_not_found"),
    (b'{"model": "g", "messages": [{"role": "user"}]}', 502, "upstream_error"),
    (b'{"model": "h", "messages": [{"role": "user"}]}', 504, "upstream_timeout"),
    (b"x" * 5000, 413, "request_too_large"),
])
def test_errors_are_openai_shaped(router: Router, body: bytes, status: int, code: str) -> None:
    got, answer = router.request("POST", "/v1/chat/completions", raw=body)
    assert got == status, answer
    assert answer["error"]["code"] == code
    assert answer["error"]["message"]


def test_slow_client_is_cut_off(router: Router) -> None:
    with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                     b"content-length: 100\r\n\r\n{")
        reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 408"), reply
    with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        assert sock.recv(65536) == b""  # closed after header_timeout


def test_unix_ingress(router: Router, tmp_path: Path) -> None:
    status = router.iface.GetStatus()
    path = next(a[5:] for a in status["ingress"] if a.startswith("unix:"))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_route_explains_candidates(router: Router) -> None:
    candidates = router.iface.Route(model="router:fast")["candidates"]
    assert candidates[0]["selected"]
    assert not any(c["selected"] for c in candidates[1:])
    assert {c["provider"] for c in candidates} >= {"good", "found"}
    with pytest.raises(varlink.VarlinkError) as caught:
        router.iface.Route(model="nope")
    assert caught.value.error() == f"{NAME}.NoRoute"
    assert router.iface.TestProvider(provider="good")["ok"]
    assert not router.iface.TestProvider(provider="garbage")["ok"]
    with pytest.raises(varlink.VarlinkError) as caught:
        router.iface.TestProvider(provider="nope")
    assert caught.value.error() == f"{NAME}.ProviderNotFound"
    router.iface.Reload()


def test_rss_stays_under_32_mib_after_200_requests(router: Router) -> None:
    for index in range(200):
        status, _ = router.request("POST", "/v1/chat/completions",
                                   _chat_body("m2", stream=index % 2 == 0))
        assert status == 200
    rss = router.rss_kib()
    print(f"routerd VmRSS after 200 requests: {rss} KiB")
    assert rss < 32 * 1024, rss
    status = router.iface.GetStatus()
    assert status["requests_total"] >= 200


SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@contextlib.contextmanager
def routed_to_runtimed(tmp_path: Path) -> Iterator[tuple[Router, Activated]]:
    """routerd with one provider, runtimed serving SmolLM2 as "smollm2";
    yields routerd and runtimed."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable")
    (tmp_path / "config").mkdir(parents=True, exist_ok=True)
    (tmp_path / "config" / "routerd.toml").write_text(
        '[http]\nlisten = ["127.0.0.1:0"]\n'
        '[[providers]]\nid = "local"\nkind = "runtimed"\nmodels = ["smollm2"]\n')
    with ExitStack() as stack, model_node(tmp_path, stack) as runtimed:
        daemon = stack.enter_context(activated("routerd", tmp_path))
        router = Router(daemon.address, daemon.process.pid)
        try:
            yield router, runtimed
        finally:
            router.close()


def test_chat_through_runtimed_smollm2(tmp_path: Path) -> None:
    with routed_to_runtimed(tmp_path) as (router, _):
        status, answer = router.request("POST", "/v1/chat/completions", _chat_body(
            "smollm2", max_tokens=8, temperature=0), timeout=120)
        assert status == 200, answer
        assert answer["object"] == "chat.completion"
        assert answer["choices"][0]["message"]["content"].strip()
        status, text = router.request("POST", "/v1/chat/completions", _chat_body(
            "router:auto", max_tokens=8, temperature=0, stream=True), timeout=120)
        assert status == 200
        assert text.rstrip().endswith("data: [DONE]")
        assert '"chat.completion.chunk"' in text


def test_a_runtimed_provider_is_probed_for_real_and_its_crashes_are_in_words(
        tmp_path: Path) -> None:
    """TestProvider runs a one-token completion through runtimed and says
    which CPU code its engine runs; a request whose engine worker dies is
    answered 502 saying so, not with a lost connection, and the next one
    is served by a new worker."""
    import os
    import signal
    import threading
    import time

    from syntrop.interfaces.runtime import Runtime1
    from syntrop.varlink.client import connect

    with routed_to_runtimed(tmp_path) as (router, runtimed):
        async def engine() -> Any:
            async with await connect(Runtime1, address=runtimed.address, timeout=60) as client:
                return await client.GetEngine()

        probe = router.iface.TestProvider(provider="local")
        assert probe["ok"], probe
        assert "smollm2 answered 1 token" in probe["detail"]
        assert "CPU backend" in probe["detail"]  # and which, on which CPU
        worker = next(w for w in asyncio.run(engine())["workers"] if w.model == "smollm2")
        answers: list[tuple[int, Any]] = []
        counting = {"model": "smollm2", "prompt": "Count: 1, 2, 3, 4, 5,", "max_tokens": 1500,
                    "temperature": 0}  # goes on for long
        asking = threading.Thread(target=lambda: answers.append(router.request(
            "POST", "/v1/completions", counting, timeout=120)))
        asking.start()
        deadline = time.monotonic() + 60
        while asyncio.run(engine())["workers"][0].calls < worker.calls + 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # generating
        os.kill(worker.pid, signal.SIGSEGV)
        asking.join(60)
        status, answer = answers[0]
        assert status == 502, answer
        assert "runtimed's engine for smollm2 crashed (signal 11, SIGSEGV)" in \
            json.dumps(answer), answer
        status, again = router.request("POST", "/v1/chat/completions", _chat_body(
            "smollm2", max_tokens=4, temperature=0), timeout=120)
        assert status == 200, again


def test_malformed_http_is_answered_400_and_routerd_lives(router: Router) -> None:
    for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                 b"content-length: -1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
            sock.sendall(junk)
            assert sock.recv(65536).startswith(b"HTTP/1.1 400"), junk
    assert router.request("GET", "/health")[0] == 200


def _exchange(port: int, data: bytes, expect: bytes = b"") -> bytes:
    """Send `data`, read until the server closes (or `expect` arrived)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        while not (expect and expect in got):
            part = sock.recv(65536)
            if not part:
                break
            got += part
    return got


def test_http_framing_at_the_edges(router: Router) -> None:
    """Pipelined requests answered in order on one connection; a head over
    16 KiB is a 431; Expect: 100-continue is answered before the body is
    sent; an HTTP/1.0 client's stream ends with the connection (no chunks)."""
    chat = b'{"model": "m1", "messages": [{"role": "user", "content": "hi"}]}'
    post = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: "
            b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(chat), chat))
    got = _exchange(router.port, post + b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                    b"connection: close\r\n\r\n")
    assert got.count(b"HTTP/1.1 200 OK\r\n") == 2, got
    assert got.index(b'"choices"') < got.index(b'"status": "ok"')
    long = _exchange(router.port, b"GET /health HTTP/1.1\r\nx-long: " + b"a" * 20000)
    assert long.startswith(b"HTTP/1.1 431 "), long[:80]
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(post.replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n")
                     [:-len(chat)])
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(chat)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")
    stream = chat.replace(b'"m1",', b'"s", "stream": true,')
    old = _exchange(router.port, b"POST /v1/chat/completions HTTP/1.0\r\ncontent-type: "
                    b"application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(stream), stream))
    head, _, body = old.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding" not in head.lower()
    assert body.startswith(b"data: ") and body.endswith(b"data: [DONE]\n\n"), body


def test_openai_fields_pass_through_to_a_remote_provider_unchanged(router: Router) -> None:
    """tools, tool_choice, logprobs, n, response_format: runtimed's mapping
    is not applied to an OpenAI-style upstream, which gets them as sent."""
    fields: dict[str, Any] = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "required", "parallel_tool_calls": False, "logprobs": True,
        "top_logprobs": 2, "n": 2, "user": "u1", "frequency_penalty": 0.5,
        "response_format": {"type": "json_object"}}
    status, answer = router.request("POST", "/v1/chat/completions", _chat_body("e", **fields))
    assert status == 200, answer
    received = json.loads(answer["choices"][0]["message"]["content"])
    assert {key: received[key] for key in fields} == fields


def test_api_keys_are_required_when_configured(tmp_path: Path) -> None:
    """With http.api_keys_file: no key, a wrong key or another scheme is a
    401 in OpenAI's shape (and WWW-Authenticate), a listed key passes, as
    a bearer token or X-Api-Key (here
    to a 404: no provider), /health needs none; the official client agrees."""
    import openai

    (tmp_path / "config").mkdir(parents=True)
    (tmp_path / "keys").write_text("# one a line\nsk-first\nsk-second\n")
    (tmp_path / "config" / "routerd.toml").write_text(
        f'providers = []\n[http]\nlisten = ["127.0.0.1:0"]\napi_keys_file = "{tmp_path}/keys"\n')
    with activated("routerd", tmp_path) as daemon:
        router = Router(daemon.address, daemon.process.pid)
        try:
            body = json.dumps(_chat_body("m1")).encode()

            def post(headers: dict[str, str]) -> tuple[int, Any, str | None]:
                connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=10)
                connection.request("POST", "/v1/chat/completions", body=body,
                                   headers={"content-type": "application/json", **headers})
                response = connection.getresponse()
                answer = json.loads(response.read())
                connection.close()
                return response.status, answer, response.getheader("www-authenticate")

            for headers in ({}, {"authorization": "Bearer sk-wrong"},
                            {"authorization": "Basic c2stZmlyc3Q="},
                            {"authorization": "Bearer "}, {"x-api-key": "sk-wrong"},
                            {"x-api-key": ""}):
                status, answer, challenge = post(headers)
                assert status == 401, headers
                assert answer["error"]["code"] == "invalid_api_key"
                assert answer["error"]["type"] == "invalid_request_error"
                assert challenge is not None and challenge.startswith("Bearer")
            for key in ("sk-first", "sk-second"):
                status, answer, _ = post({"authorization": f"Bearer {key}"})
                assert status == 404 and answer["error"]["code"] == "model_not_found"
            # Anthropic's clients send theirs as X-Api-Key (a proxy's Basic
            # Authorization beside it does not hide it).
            for headers in ({"x-api-key": "sk-second"},
                            {"authorization": "Basic c2stZmlyc3Q=", "x-api-key": "sk-first"}):
                status, answer, _ = post(headers)
                assert status == 404 and answer["error"]["code"] == "model_not_found"
            assert router.request("GET", "/health")[0] == 200
            base = f"http://127.0.0.1:{router.port}/v1"
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
            listed = openai.OpenAI(base_url=base, api_key="sk-first", max_retries=0)
            assert [m.id for m in listed.models.list()] == ["router:fast", "router:hard",
                                                            "router:auto"]
        finally:
            router.close()
