"""OpenAI's speech endpoint (POST /v1/audio/speech): a voice model's speech,
made by this node's runtimed (Runtime1.Speak) and streamed as chunked
transfer as its 20 ms packets come: raw PCM (S16LE mono 24 kHz) or the same
samples under a WAV header. Fleet members and other providers do not speak
yet: the voice must be in this node's modeld.

OpenAI's speed is 0.25 to 4.0, runtimed's 0.5 to 2.0: a speed in OpenAI's
range is clamped to runtimed's; outside it, a 400. A client that goes away
mid-stream closes the Speak call (its worker stops)."""

import logging
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from syntrop.routerd.api import BadRequest, Response, error, parse
from syntrop.routerd.providers.runtimed import RuntimedProvider

if TYPE_CHECKING:
    from syntrop.routerd.queues import Admission
    from syntrop.routerd.registry import Registry

logger = logging.getLogger(__name__)

#: runtimed's speech: mono signed 16-bit little-endian PCM at this rate.
RATE = 24_000
#: Most characters of input (OpenAI's limit and runtimed's).
MAX_INPUT = 4096
#: The response formats served, with their Content-Type.
FORMATS = {"pcm": "audio/pcm", "wav": "audio/wav"}
#: Served when a request names none (OpenAI's default, mp3, is not served).
DEFAULT_FORMAT = "wav"
#: OpenAI's voices: each is the voice model's default (first) speaker.
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "nova",
                           "onyx", "sage", "shimmer", "verse", "default"})
#: Speeds OpenAI accepts, and those runtimed does (the first clamped into the second).
OPENAI_SPEEDS = (0.25, 4.0)
RUNTIMED_SPEEDS = (0.5, 2.0)
#: A streaming WAV's RIFF and data sizes: unknown until the end, so the
#: largest (as streaming servers write them); readers take the data to EOF.
UNKNOWN_SIZE = 0xFFFFFFFF


class Gateway(Protocol):
    """What speech asks of routerd's gateway (gateway.py, which imports this)."""

    registry: "Registry"
    admission: "Admission"
    requests_total: int
    #: Called when a request ends.
    changed: Callable[[], None]

    async def _admit(self, traffic: str) -> Response | None: ...


def wav_header(rate: int = RATE) -> bytes:
    """A 44-byte RIFF/WAVE header for mono S16LE at `rate`, its sizes unknown."""
    return (b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", UNKNOWN_SIZE))


@dataclass(frozen=True, slots=True)
class Asked:
    """A speech request, checked: runtimed's arguments and the format."""

    model: str
    text: str
    #: A speaker of the voice; None for its default.
    voice: str | None
    speed: float | None
    format: str


def asked(body: Any) -> Asked:
    """The request's fields, checked (each BadRequest names its field)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a voice model's name", "model")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip() or "\0" in text:
        raise BadRequest("input must be a non-empty string of text", "input")
    if len(text) > MAX_INPUT:
        raise BadRequest(f"input must be at most {MAX_INPUT} characters", "input")
    voice = body.get("voice")
    if voice is not None and (not isinstance(voice, str) or not 0 < len(voice) <= 256):
        raise BadRequest("voice must be a speaker's name", "voice")
    response_format = body.get("response_format")
    if response_format is None:
        response_format = DEFAULT_FORMAT
    if response_format not in FORMATS:
        raise BadRequest(f"response_format must be one of {', '.join(FORMATS)} "
                         f"(not {str(response_format)[:40]!r})", "response_format")
    if body.get("stream_format") not in (None, "audio"):
        raise BadRequest("stream_format must be audio", "stream_format")
    speed = body.get("speed")
    if speed is not None:
        if isinstance(speed, bool) or not isinstance(speed, int | float) or \
                not OPENAI_SPEEDS[0] <= speed <= OPENAI_SPEEDS[1]:
            raise BadRequest(f"speed must be a number from {OPENAI_SPEEDS[0]} to "
                             f"{OPENAI_SPEEDS[1]}", "speed")
        speed = min(max(float(speed), RUNTIMED_SPEEDS[0]), RUNTIMED_SPEEDS[1])
    return Asked(model, text, None if voice is None or voice in OPENAI_VOICES else voice,
                 speed, response_format)


def local_runtimed(registry: "Registry") -> RuntimedProvider | None:
    """This node's runtimed: the first runtimed provider configured."""
    for config in registry.config.providers:
        provider = registry.providers.get(config.id)
        if isinstance(provider, RuntimedProvider):
            return provider
    return None


def refused(failure: BaseException, model: str) -> Response:
    """runtimed's answer to a Speak call that did not begin, in OpenAI's words."""
    from asyncvarlink.serviceerrors import InvalidParameter

    from syntrop.interfaces.runtime import InvalidModel, ModelNotFound, NotAVoice
    from syntrop.routerd.providers.runtimed import _failed

    if isinstance(failure, ModelNotFound):
        return error(404, f"the model {model!r} does not exist", "model_not_found", "model")
    if isinstance(failure, NotAVoice | InvalidModel):
        return error(400, f"the model {model!r} is not a voice", "invalid_value", "model")
    if isinstance(failure, InvalidParameter):
        param = {"text": "input"}.get(failure.p_parameter, failure.p_parameter)
        return error(400, f"runtimed refused {param}", "invalid_value", param)
    if not isinstance(failure, Exception):
        raise failure
    provider_error = _failed(failure)
    return error(provider_error.status, provider_error.message, "upstream_error")


async def speech(gateway: Gateway, method: str, body: bytes, traffic: str) -> Response:
    """POST /v1/audio/speech: checked, admitted like a model request (its
    place held until the stream ends), its first packet awaited before the
    answer (so that runtimed's refusal is the status), then streamed."""
    if method != "POST":
        return error(405, "use POST")
    try:
        request = asked(parse(body))
    except BadRequest as bad:
        return error(400, str(bad), bad.code, bad.param)
    provider = local_runtimed(gateway.registry)
    if provider is None:
        return error(404, "no runtimed on this node speaks", "model_not_found", "model")
    gateway.requests_total += 1
    if (full := await gateway._admit(traffic)) is not None:
        return full
    packets = provider.speak(request.model, request.text, request.voice, request.speed)
    try:
        first = await anext(packets, b"")
    except BaseException as failure:
        await packets.aclose()
        _leave(gateway, traffic)
        return refused(failure, request.model)

    async def close() -> None:
        try:
            await packets.aclose()
        finally:
            _leave(gateway, traffic)

    header = wav_header() if request.format == "wav" else b""
    return Response(200, content_type=FORMATS[request.format],
                    stream=_relay(header + first, packets), closer=close,
                    headers=((b"x-syntrop-provider", provider.config.id.encode()),))


def _leave(gateway: Gateway, traffic: str) -> None:
    """Give back the place in flight the request was admitted to."""
    gateway.admission.leave(traffic)
    gateway.changed()


async def _relay(first: bytes, packets: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """The response body: `first`, then each packet as it comes. A failure
    mid-stream cannot change the status: the connection is cut instead
    (no last chunk), so the client sees the body incomplete."""
    yield first
    try:
        async for pcm in packets:
            yield pcm
    except Exception as failure:
        logger.warning("speech failed mid-stream: %s", failure)
        raise ConnectionAbortedError("speech failed mid-stream") from failure
