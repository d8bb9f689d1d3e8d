"""Negative or huge numbers in request fields (CVE-2026-21869 class: a
count or size taken from a request and trusted for an allocation or a
loop). Every numeric field of routerd's /v1/chat/completions body, and of
Runtime1's Sampling over Varlink, with -1, 0, 2^31, 2^63, NaN, Infinity and
1e308: each answer is a declared error (HTTP 400, a Varlink error) or a
clamped generation, within a few seconds; afterwards a normal request is
still served. Generations are one token long (max_tokens 1) but for the
max_tokens field itself, which stops at the first space or newline."""

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.models import require_llama, router_node
from tests.service.wire import Reader, connect, encode

require_llama()

VALUES: list[Any] = [-1, 0, 1 << 31, 1 << 63, float("nan"), float("inf"), 1e308]
HTTP_FIELDS = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
               "seed", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
               "min_p", "best_of", "n_discard", "n_keep", "n_probs"]
SAMPLING_FIELDS = ["max_tokens", "temperature", "top_p", "top_k", "seed", "min_p",
                   "reasoning_budget", "logprobs"]
#: Stops that end a generation whose max_tokens is the field under test.
STOPS = [" ", "\n", ".", ","]
#: How long one hostile request may take.
ANSWER_S = 5.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """routerd's port, and runtimed's socket behind it."""
    root = tmp_path_factory.mktemp("numbers")
    with router_node(root) as port:
        yield port, root / "run" / "io.syntrop.Runtime1"


def _post(port: int, fields: dict[str, Any]) -> tuple[int, Any]:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1, "stop": STOPS, **fields}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        # json.dumps writes NaN and Infinity as bare tokens: the hostile bytes.
        connection.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                           headers={"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def _complete(socket_path: Path, sampling: dict[str, Any]) -> list[dict[str, Any]]:
    """Runtime1.Complete over raw Varlink: every reply, up to the last."""
    replies = []
    with connect(socket_path, timeout=30) as sock:
        sock.sendall(encode("io.syntrop.Runtime1.Complete", {
            "model": "smollm2", "prompt": "Hi", "sampling": {"max_tokens": 1, "stop": STOPS,
                                                            **sampling}}, more=True))
        reader = Reader(sock)
        while (reply := reader.next()) is not None:
            replies.append(reply)
            if not reply.get("continues"):
                break
    return replies


@pytest.mark.parametrize("field", HTTP_FIELDS)
def test_routerd_answers_every_hostile_number_with_400_or_a_generation(
    node: tuple[int, Path], field: str
) -> None:
    port, _ = node
    for value in VALUES:
        start = time.monotonic()
        status, answer = _post(port, {field: value})
        elapsed = time.monotonic() - start
        assert status in (200, 400), (field, value, status, answer)
        assert elapsed < ANSWER_S, (field, value, elapsed)
        if status == 200:
            assert answer["choices"], (field, value, answer)
    assert _post(port, {})[0] == 200, field


@pytest.mark.parametrize("field", SAMPLING_FIELDS)
def test_runtimed_answers_every_hostile_sampling_number_with_an_error_or_a_chunk(
    node: tuple[int, Path], field: str
) -> None:
    _, runtime = node
    for value in VALUES:
        start = time.monotonic()
        replies = _complete(runtime, {field: value})
        elapsed = time.monotonic() - start
        assert replies, (field, value)
        last = replies[-1]
        if "error" in last:
            assert last["error"].startswith(("io.syntrop.Runtime1.", "org.varlink.service.")), \
                (field, value, last)
        else:
            assert "parameters" in last, (field, value, last)
        assert elapsed < ANSWER_S, (field, value, elapsed)
    assert "error" not in _complete(runtime, {})[-1], field
