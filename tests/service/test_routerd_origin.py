"""A web page may not drive the loopback gateway: a request whose Host
is not routerd's (DNS rebinding) is 421, a POST not declared JSON (a
cross-site form or text/plain post, which needs no preflight) is 415,
and an OpenAI client is served as before. Real routerd, socket-activated,
on loopback, with an OpenAI upstream."""

import http.client
import json
from collections.abc import Iterator

import pytest

from tests.service.test_routerd import Router, configured

CONFIG = """
providers = []
[http]
listen = ["127.0.0.1:0"]
allowed_hosts = ["router.lan"]
"""


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with configured(tmp_path_factory.mktemp("routerd-origin"), CONFIG) as router:
        yield router


def ask(router: Router, method: str, path: str, headers: dict[str, str],
        body: bytes | None = None) -> tuple[int, dict[str, object]]:
    connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
    # http.client sends its own Host unless one is given.
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer


def test_a_rebound_name_gets_421(router: Router) -> None:
    for host in ("evil.example", f"evil.example:{router.port}", "10.0.0.7"):
        status, answer = ask(router, "GET", "/v1/models", {"host": host})
        assert status == 421, (host, answer)
        error = answer["error"]
        assert isinstance(error, dict) and error["code"] == "misdirected_request"
        assert "allowed_hosts" in error["message"]


def test_its_own_names_pass(router: Router) -> None:
    for host in (f"127.0.0.1:{router.port}", f"localhost:{router.port}", "[::1]",
                 "router.lan:1234"):
        assert ask(router, "GET", "/v1/models", {"host": host})[0] == 200, host


def test_a_post_not_declared_json_gets_415(router: Router) -> None:
    body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
    for headers in ({"content-type": "text/plain"},
                    {"content-type": "application/x-www-form-urlencoded"}, {}):
        status, answer = ask(router, "POST", "/v1/chat/completions", headers, body.encode())
        assert status == 415, (headers, answer)
        error = answer["error"]
        assert isinstance(error, dict) and "application/json" in str(error["message"])


def test_an_openai_client_is_served(router: Router) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.port}/v1", api_key="none",
                           max_retries=0)
    assert [m.id for m in client.models.list()] == ["router:fast", "router:hard",
                                                    "router:auto"]
    with pytest.raises(openai.NotFoundError):  # past the checks: no provider has it
        client.chat.completions.create(model="m1",
                                       messages=[{"role": "user", "content": "hi"}])
