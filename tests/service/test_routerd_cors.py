"""A browser page at an allowed origin (routerd.toml's http.cors_origins)
calls routerd: its preflight is answered before any key is asked, and the
answers carry Access-Control-Allow-Origin; any other origin is refused at
the preflight and gets no such header. Real routerd, socket-activated, on
loopback, with an OpenAI upstream."""

import http.client
import json
from collections.abc import Iterator

import pytest

from tests.service.test_routerd import Router, configured

ALLOWED = "http://localhost:3000"
CONFIG = f"""
[http]
listen = ["127.0.0.1:0"]
cors_origins = ["{ALLOWED}"]

[[providers]]
id = "up"
kind = "openai"
endpoint = "http://127.0.0.1:{{port}}/good/v1"
models = ["m1"]
"""


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with configured(tmp_path_factory.mktemp("routerd-cors"), CONFIG) as router:
        yield router


def ask(router: Router, method: str, path: str, headers: dict[str, str],
        body: bytes | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_a_preflight_from_an_allowed_origin_is_answered(router: Router) -> None:
    answer = ask(router, "OPTIONS", "/v1/chat/completions", {
        "origin": ALLOWED, "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, authorization"})
    assert answer.status == 204
    assert answer.getheader("access-control-allow-origin") == ALLOWED
    assert "POST" in (answer.getheader("access-control-allow-methods") or "")
    assert answer.getheader("access-control-allow-headers") == "content-type, authorization"


def test_the_real_request_carries_the_origin(router: Router) -> None:
    body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
    answer = ask(router, "POST", "/v1/chat/completions",
                 {"origin": ALLOWED, "content-type": "application/json"}, body.encode())
    assert answer.status == 200
    assert answer.getheader("access-control-allow-origin") == ALLOWED
    assert answer.getheader("vary") == "origin"


def test_another_origin_is_refused_and_gets_no_allow_header(router: Router) -> None:
    preflight = ask(router, "OPTIONS", "/v1/chat/completions", {
        "origin": "http://evil.example", "access-control-request-method": "POST"})
    assert preflight.status == 403
    assert preflight.getheader("access-control-allow-origin") is None
    plain = ask(router, "GET", "/v1/models", {"origin": "http://evil.example"})
    assert plain.status == 200 and plain.getheader("access-control-allow-origin") is None
    # A plain OPTIONS (no preflight) is what it was: not a route.
    assert ask(router, "OPTIONS", "/v1/models", {}).status == 405
