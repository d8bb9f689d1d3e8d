"""routerd under hostile HTTP, for real (socket-activated, loopback): each
malformed request is answered 4xx in OpenAI's shape naming what is wrong,
never 502, and routerd still serves afterwards."""

import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.service.test_routerd import Router, configured

CONFIG = """
[http]
listen = ["127.0.0.1:0"]
max_body_bytes = 1048576

[[providers]]
id = "small"
kind = "openai"
endpoint = "http://127.0.0.1:{port}/good/v1"
models = ["m1"]
context_window = 1000

[[providers]]
id = "larger"
kind = "openai"
endpoint = "http://127.0.0.1:{port}/good/v1"
models = ["m1"]
context_window = 4000
"""


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with configured(tmp_path_factory.mktemp("routerd-hostile"), CONFIG) as router:
        yield router


def _post(router: Router, body: bytes, content_type: str | None = "application/json",
          path: str = "/v1/chat/completions") -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
    headers = {} if content_type is None else {"content-type": content_type}
    connection.request("POST", path, body=body, headers=headers)
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer


def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}],
                       **fields}).encode()


def _answer(sock: socket.socket) -> bytes:
    """What routerd answers, up to its JSON body's end or the close."""
    answer = b""
    while not answer.endswith(b"}"):
        got = sock.recv(65536)
        if not got:
            break
        answer += got
    return answer


def test_a_body_over_max_body_is_413_from_its_length(router: Router) -> None:
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: "
                     b"application/json\r\ncontent-length: 1048577\r\n\r\n")
        answer = _answer(sock)  # before any of the body is sent
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:80]
    assert b'"request_too_large"' in answer


def test_a_chunked_body_over_max_body_is_413_while_it_is_read(router: Router) -> None:
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: "
            b"application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    part = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(head)
        try:  # 4 MiB, never ended: routerd must answer before the body does
            for _ in range(64):
                sock.sendall(part)
        except OSError:
            pass
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:80]


@pytest.mark.parametrize(("body", "why"), [
    (b"[" * 100_000 + b"]" * 100_000, "JSON values"),  # refused before parsing
    (b"[" * 5000 + b"]" * 5000, "nested"),
    (b'{"model": "m1", "x": ' + b"[" * 500 + b"]" * 500 + b"}", "nested"),
    (b"[" + b"{}," * 100_000 + b"{}]", "JSON values"),
])
def test_json_too_deep_or_too_many_values_is_400(router: Router, body: bytes, why: str) -> None:
    status, answer = _post(router, body)
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_json"
    assert why in answer["error"]["message"]


@pytest.mark.parametrize(("fields", "param"), [
    ({"stop": {"a": 1}}, "stop"),
    ({"stop": ["x", 1]}, "stop"),
    ({"temperature": "hot"}, "temperature"),
    ({"presence_penalty": [1]}, "presence_penalty"),
    ({"logit_bias": {"1": "x"}}, "logit_bias"),
    ({"tools": "none"}, "tools"),
    ({"user": 5}, "user"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [1]}]}, "messages[0].content"),
    ({"messages": [{"role": 1, "content": "hi"}]}, "messages[0].role"),
    ({"messages": ["hi"]}, "messages[0]"),
])
def test_a_field_of_the_wrong_type_is_400_naming_it(router: Router, fields: dict[str, Any],
                                                    param: str) -> None:
    status, answer = _post(router, _chat(**fields))
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert answer["error"]["message"].startswith(param + " must be")
    assert answer["error"]["type"] == "invalid_request_error"


def test_a_body_that_is_not_json_by_its_type_is_415(router: Router) -> None:
    status, answer = _post(router, _chat(), "text/plain")
    assert status == 415, answer
    assert "application/json" in answer["error"]["message"]
    assert _post(router, _chat(), "application/json; charset=utf-8")[0] == 200
    # None declared: refused too (a page posts one across sites unasked).
    assert _post(router, _chat(), None)[0] == 415


def test_a_prompt_over_every_context_window_is_400(router: Router) -> None:
    status, answer = _post(router, _chat(messages=[{"role": "user", "content": "a" * 1_000_000}]))
    assert status == 400, answer
    assert answer["error"]["code"] == "context_length_exceeded"
    assert answer["error"]["param"] == "messages"
    assert "4000 tokens" in answer["error"]["message"]
    # Over the smaller window only: the larger serves it.
    assert _post(router, _chat(messages=[{"role": "user", "content": "a" * 8000}]))[0] == 200
    status, answer = _post(router, json.dumps({"model": "m1", "prompt": "a" * 20000}).encode(),
                           path="/v1/completions")
    assert (status, answer["error"]["param"]) == (400, "prompt")


def test_routerd_serves_after_the_hostile_requests(router: Router) -> None:
    assert _post(router, _chat())[0] == 200
