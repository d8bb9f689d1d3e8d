"""routerd's /v1/audio/speech (pure parts): the request checked, OpenAI's
voices and speeds mapped to runtimed's, the streaming WAV header."""

import io
import wave
from pathlib import Path
from typing import Any

import pytest

from syntrop.routerd import speech
from syntrop.routerd.api import BadRequest

NOWHERE = Path("/nowhere")


def _asked(**fields: Any) -> speech.Asked:
    return speech.asked({"model": "joe", "input": "Hello.", **fields})


def test_openais_voices_are_the_default_speaker_others_pass_through() -> None:
    for name in ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                 "shimmer", "verse", "default"):
        assert _asked(voice=name).voice is None
    assert _asked().voice is None
    assert _asked(voice="amy").voice == "amy"


def test_formats_default_to_wav_and_others_are_refused() -> None:
    assert _asked().format == "wav"
    assert _asked(response_format="pcm").format == "pcm"
    for name in ("mp3", "opus", "aac", "flac", 3):
        with pytest.raises(BadRequest) as caught:
            _asked(response_format=name)
        assert caught.value.param == "response_format"


def test_speed_is_clamped_into_runtimeds_range_within_openais() -> None:
    assert _asked().speed is None
    assert _asked(speed=0.25).speed == 0.5
    assert _asked(speed=4).speed == 2.0
    assert _asked(speed=1.25).speed == 1.25
    for bad in (0.2, 4.5, True, "1"):
        with pytest.raises(BadRequest) as caught:
            _asked(speed=bad)
        assert caught.value.param == "speed"


@pytest.mark.parametrize(("fields", "param"), [
    ({"input": ""}, "input"), ({"input": "  "}, "input"), ({"input": None}, "input"),
    ({"input": "x" * 4097}, "input"), ({"input": "a\0b"}, "input"),
    ({"model": ""}, "model"), ({"model": 3}, "model"), ({"voice": ""}, "voice"),
    ({"voice": 1}, "voice"), ({"stream_format": "sse"}, "stream_format"),
])
def test_bad_fields_are_named(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        _asked(**fields)
    assert caught.value.param == param


def test_at_most_4096_characters() -> None:
    assert _asked(input="x" * 4096).text == "x" * 4096
    with pytest.raises(BadRequest):
        speech.asked([])


def test_the_wav_header_is_44_bytes_of_mono_s16_24khz_of_unknown_size() -> None:
    header = speech.wav_header()
    assert len(header) == 44
    assert header[4:8] == header[40:44] == b"\xff\xff\xff\xff"
    samples = b"\x01\x00\xff\x7f" * 100
    with wave.open(io.BytesIO(header + samples)) as read:
        assert (read.getnchannels(), read.getsampwidth(), read.getframerate()) == (1, 2, 24_000)
        assert read.readframes(1000) == samples  # the data runs to the end


class _Admission:
    def __init__(self) -> None:
        self.inside = 0

    def leave(self, traffic: str) -> None:
        self.inside -= 1


class _Gateway:
    """What speech() asks of the gateway: the registry, admission, counters."""

    def __init__(self, provider: Any) -> None:
        from types import SimpleNamespace

        self.registry = SimpleNamespace(config=SimpleNamespace(providers=[provider.config]),
                                        providers={provider.config.id: provider})
        self.admission = _Admission()
        self.requests_total = 0

    async def _admit(self, traffic: str) -> None:
        self.admission.inside += 1

    def changed(self) -> None:
        pass


def _provider(packets: list[bytes], failure: Exception | None = None) -> Any:
    from syntrop.config import Paths
    from syntrop.routerd.config import ProviderConfig
    from syntrop.routerd.providers.runtimed import RuntimedProvider

    class Speaking(RuntimedProvider):
        closed = False

        async def speak(self, model: str, text: str, voice: str | None,
                        speed: float | None) -> Any:
            try:
                if failure is not None:
                    raise failure
                for packet in packets:
                    yield packet
            finally:
                Speaking.closed = True

    return Speaking(ProviderConfig(id="local", kind="runtimed", endpoint="unix:/nowhere"),
                    Paths(runtime=NOWHERE, state=NOWHERE, cache=NOWHERE,
                          configuration=NOWHERE))


def _body(fmt: str) -> bytes:
    import json

    return json.dumps({"model": "joe", "voice": "alloy", "input": "Hi.",
                       "response_format": fmt}).encode()


async def _read(gateway: Any, fmt: str) -> tuple[int, str, bytes]:
    response = await speech.speech(gateway, "POST", _body(fmt), "user")
    body = response.body
    if response.stream is not None:
        body = b"".join([part async for part in response.stream])
    if response.closer is not None:
        await response.closer()
    return response.status, response.content_type, body


def test_wav_is_the_pcm_body_under_the_header_and_the_place_is_given_back() -> None:
    import asyncio

    packets = [bytes([n]) * 960 for n in range(5)] + [b"\x01\x02"]
    provider = _provider(packets)
    gateway = _Gateway(provider)
    status, kind, pcm = asyncio.run(_read(gateway, "pcm"))
    assert (status, kind, pcm) == (200, "audio/pcm", b"".join(packets))
    status, kind, wav = asyncio.run(_read(gateway, "wav"))
    assert (status, kind) == (200, "audio/wav")
    assert wav[:44] == speech.wav_header() and wav[44:] == pcm
    assert gateway.admission.inside == 0 and gateway.requests_total == 2


def test_a_response_abandoned_mid_stream_closes_the_speak_call() -> None:
    import asyncio

    provider = _provider([b"\x00\x00" * 480] * 50)
    gateway: Any = _Gateway(provider)

    async def main() -> None:
        response = await speech.speech(gateway, "POST", _body("pcm"), "user")
        assert response.stream is not None and response.closer is not None
        await anext(response.stream)  # the client reads one packet, then goes
        await response.closer()

    asyncio.run(main())
    assert type(provider).closed and gateway.admission.inside == 0


def test_runtimeds_refusals_in_openais_words() -> None:
    import asyncio
    import json

    from asyncvarlink.serviceerrors import InvalidParameter

    from syntrop.interfaces.runtime import ModelNotFound, NotAVoice

    for failure, status, param in ((ModelNotFound(model="joe"), 404, "model"),
                                   (NotAVoice(model="joe"), 400, "model"),
                                   (InvalidParameter(parameter="voice"), 400, "voice"),
                                   (InvalidParameter(parameter="text"), 400, "input")):
        gateway = _Gateway(_provider([], failure))
        got, _, body = asyncio.run(_read(gateway, "pcm"))
        assert (got, json.loads(body)["error"]["param"]) == (status, param)
        assert gateway.admission.inside == 0
