"""OpenAI's /v1/audio/speech through routerd (socket-activated) to runtimed's
packaged voice: the official OpenAI client streams PCM; WAV is the same
speech under a header; refusals name their field; a client that goes away
mid-stream ends the Speak call. Skipped where the synthesizer, the voice or
SmolLM2 (the node's language model) is not installed."""

import asyncio
import http.client
import importlib.util
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from syntrop import packaged
from tests.models import register, require_llama, router_node

pytestmark = pytest.mark.service

require_llama()
if importlib.util.find_spec("openai") is None:
    pytest.skip("the openai client is not installed (pip install -e '.[test]')",
                allow_module_level=True)
if importlib.util.find_spec("piper") is None or not packaged.installed(packaged.JOE):
    pytest.skip("the speech synthesizer or the packaged voice is not installed",
                allow_module_level=True)

TEXT = ("The quick brown fox jumps over the lazy dog. It was a sunny day in the park. "
        "Everyone smiled and waved.")


@dataclass
class Node:
    root: Path
    port: int


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("routerd-speech")
    with router_node(root) as port:
        path = packaged.locate(packaged.JOE)
        assert path is not None
        register(root, "joe", path, packaged.JOE.sha256)
        node = Node(root, port)
        # The voice loaded by one request here, so the timings below are speech's.
        assert _speech(node, model="joe", input="Hello.", response_format="pcm")[0] == 200
        yield node


def _speech(node: Node, **fields: Any) -> tuple[int, http.client.HTTPMessage, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=120)
    try:
        connection.request("POST", "/v1/audio/speech", body=json.dumps(fields),
                           headers={"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def test_the_openai_client_streams_pcm_and_wav_is_the_same_samples(node: Node) -> None:
    import openai

    with openai.OpenAI(base_url=f"http://127.0.0.1:{node.port}/v1", api_key="unused",
                       timeout=120, max_retries=0) as client:
        started = time.monotonic()
        first: float | None = None
        parts: list[bytes] = []
        with client.audio.speech.with_streaming_response.create(
                model="joe", voice="alloy", input=TEXT, response_format="pcm") as response:
            assert response.headers["content-type"] == "audio/pcm"
            assert response.headers["transfer-encoding"] == "chunked"
            for part in response.iter_bytes():
                if first is None:
                    first = time.monotonic() - started
                parts.append(part)
    pcm = b"".join(parts)
    assert pcm and len(pcm) % 2 == 0
    assert len(pcm) / 2 / 24_000 > 1.0  # twenty words take seconds to say
    assert first is not None
    print(f"first audio byte over HTTP after {first * 1000:.0f} ms, "
          f"{len(pcm) / 48_000:.2f} s of speech")
    status, headers, wav = _speech(node, model="joe", voice="default", input=TEXT,
                                   response_format="wav")
    assert status == 200 and headers["Content-Type"] == "audio/wav"
    assert headers["Transfer-Encoding"] == "chunked"
    assert wav[:4] == b"RIFF" and wav[8:16] == b"WAVEfmt " and wav[36:40] == b"data"
    assert int.from_bytes(wav[24:28], "little") == 24_000
    # The voice draws its durations with a little noise, so two calls differ
    # by a few percent (test_runtimed_speech): the same samples, bit for bit,
    # under the header is unit-tested (tests/unit/routerd/test_speech.py).
    data = wav[44:]
    assert len(data) % 2 == 0 and abs(len(data) - len(pcm)) <= len(pcm) // 7


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": "mp3"}, "response_format"),
    ({"response_format": "opus"}, "response_format"),
    ({"input": ""}, "input"),
    ({"input": "x" * 4097}, "input"),
    ({"input": 7}, "input"),
    ({"speed": 9.0}, "speed"),
    ({"voice": "nobody"}, "voice"),
    ({"model": "smollm2"}, "model"),  # a language model, no voice
])
def test_bad_requests_get_400_naming_the_field(node: Node, fields: dict[str, Any],
                                               param: str) -> None:
    status, _, body = _speech(node, **{"model": "joe", "voice": "alloy", "input": "Hello.",
                                       "response_format": "pcm", **fields})
    assert status == 400, body
    assert json.loads(body)["error"]["param"] == param


def test_an_unknown_model_is_404_in_openais_shape(node: Node) -> None:
    status, _, body = _speech(node, model="nobody", voice="alloy", input="Hello.")
    assert status == 404
    assert json.loads(body)["error"]["code"] == "model_not_found"


def test_a_client_that_goes_away_ends_the_speak_call(node: Node) -> None:
    from syntrop.interfaces.runtime import Runtime1
    from syntrop.varlink.client import connect

    async def free() -> tuple[int, int]:
        address = f"unix:{node.root / 'run' / Runtime1.name}"
        async with await connect(Runtime1, address=address, timeout=30) as runtime:
            load = await runtime.GetLoad()
            return load["free_slots"], load["total_slots"]

    body = json.dumps({"model": "joe", "voice": "alloy", "input": TEXT * 20,
                       "response_format": "pcm"}).encode()
    with socket.create_connection(("127.0.0.1", node.port), timeout=60) as client:
        client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        received = b""
        while len(received) < 10_000:
            part = client.recv(65536)
            assert part
            received += part
        assert received.startswith(b"HTTP/1.1 200")
        slots, total = asyncio.run(free())
        assert slots < total  # the call holds a slot while it speaks
    deadline = time.monotonic() + 5
    while asyncio.run(free())[0] < total:
        assert time.monotonic() < deadline, "the Speak call went on after the client left"
        time.sleep(0.1)
