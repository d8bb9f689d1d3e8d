"""A voice's engine, inside its worker process: the same worker as a GGUF
model's (loop.py), holding a speech synthesizer instead of llama.cpp, so a
fault in the synthesizer's native code (ONNX Runtime, espeak-ng) ends only
this voice's calls.

The worker learns it hosts a voice at `load`, from the file's first bytes
(modelfile: ONNX, not GGUF). The voice's JSON config is not in modeld: it
comes from the package that carries the voice, found by the model's digest
(syntrop.packaged.config_of says why). `speak` synthesizes one sentence at
a time and sends each sentence's speech as soon as it is made, resampled
and cut into packets (speech.py), checking between packets whether the
call was cancelled. Calls run on threads of their own (loop.py): the
sentences' synthesis (ONNX Runtime) runs side by side, while turning text
into phonemes, which goes through espeak-ng's one global state, is taken
one call at a time (`_PHONEMIZING`).
"""

import base64
import logging
import os
import threading
from typing import Any, Protocol

from syntrop import modelfile
from syntrop.runtimed.protocol import Kind, Speak, WorkerError
from syntrop.runtimed.worker.speech import Packets

logger = logging.getLogger(__name__)

#: espeak-ng keeps its state in globals: one phonemizing at a time.
_PHONEMIZING = threading.Lock()


class AudioSink(Protocol):
    """Where a speech stream's packets go (loop.WireSink)."""

    stop: threading.Event

    def audio(self, packet: bytes, sentence: int) -> None: ...


def is_voice(fd: int) -> bool:
    """Whether the model behind `fd` is a voice (an ONNX file)."""
    try:
        return modelfile.read_fd(fd).format == "onnx"
    except (modelfile.InvalidModel, OSError):
        return False


class Voice:
    """One voice, loaded from modeld's descriptor (kept open: modeld's
    in-use lock) and its packaged config."""

    def __init__(self, name: str, fd: int, digest: str) -> None:
        from piper import PiperVoice

        from syntrop import packaged

        config = packaged.config_of(digest)
        if config is None:
            os.close(fd)
            raise WorkerError(Kind.INVALID_MODEL, model=name,
                              reason="a voice with no config installed "
                                     "(only packaged voices can be spoken yet)")
        self.name = name
        self.fd = fd
        self.voice = PiperVoice.load(f"/proc/self/fd/{fd}", config_path=config)
        phonemize = self.voice.phonemize

        def one_at_a_time(text: str) -> list[list[str]]:
            with _PHONEMIZING:
                return phonemize(text)

        # synthesize() phonemizes the whole text through this, first.
        self.voice.phonemize = one_at_a_time  # type: ignore[method-assign]
        self.rate = int(self.voice.config.sample_rate)
        logger.info("voice %s: %d Hz, %d speakers", name, self.rate,
                    self.voice.config.num_speakers)

    def _speaker(self, name: str | None) -> int | None:
        if name is None:
            return None
        speakers = dict(self.voice.config.speaker_id_map)
        if name not in speakers:
            raise WorkerError(Kind.INVALID_PARAMETER, parameter="voice")
        return int(speakers[name])

    def speak(self, request: Speak, sink: AudioSink) -> dict[str, Any]:
        """Say `request.text`; each packet goes to `sink` as it is cut."""
        from piper import SynthesisConfig

        speed = request.speed or 1.0
        config = SynthesisConfig(speaker_id=self._speaker(request.voice),
                                 length_scale=1.0 / speed)
        packets = Packets(self.rate)
        sentence = 0
        for sentence, chunk in enumerate(self.voice.synthesize(request.text, config)):
            for packet in packets.feed(chunk.audio_int16_bytes):
                if sink.stop.is_set():
                    return {"reason": "cancelled", "total_samples": packets.sent}
                sink.audio(packet, sentence)
        for packet in packets.close():
            sink.audio(packet, sentence)
        return {"reason": "stop", "total_samples": packets.sent, "sentences": sentence + 1}


def encode(packet: bytes) -> str:
    """A packet as a Piece's text."""
    return base64.b64encode(packet).decode("ascii")
