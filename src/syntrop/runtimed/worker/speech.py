"""Speech out of a voice, as Runtime1.Speak sends it: mono S16LE PCM at
24,000 Hz in packets of at most 20 ms (480 samples).

A voice synthesizes at its own rate (22,050 Hz for most) one sentence at a
time. `Packets` takes each sentence's samples as they come, resamples
them with a streaming polyphase resampler (soxr: a band-limited filter,
not nearest-sample; its state carries across sentences, so a sentence's
edge is no seam) and cuts what it has into whole packets at once; `close`
flushes the filter's tail and the last, shorter packet. Pure: no voice,
no I/O (worker/voice.py feeds it).
"""

from collections.abc import Iterator

import numpy as np
import soxr

from syntrop.runtimed.protocol import SPEECH_RATE

#: The rate every Speak packet has.
RATE = SPEECH_RATE
#: Samples per packet: 20 ms at RATE.
PACKET = RATE // 50


class Packets:
    """Samples at `rate` in, packets of S16LE at RATE out, in order."""

    def __init__(self, rate: int, packet: int = PACKET) -> None:
        if rate <= 0 or packet <= 0:
            raise ValueError("rate and packet must be positive")
        self.rate = rate
        self.packet = packet
        self._same = rate == RATE
        self._stream = None if self._same else soxr.ResampleStream(
            rate, RATE, 1, dtype="int16", quality="HQ")
        self._pending = np.zeros(0, dtype=np.int16)
        #: Samples at RATE sent out so far.
        self.sent = 0

    def _out(self, samples: "np.ndarray[tuple[int], np.dtype[np.int16]]", last: bool,
             ) -> Iterator[bytes]:
        pending = np.concatenate((self._pending, samples)) if self._pending.size else samples
        whole = pending.size - pending.size % self.packet
        for start in range(0, whole, self.packet):
            self.sent += self.packet
            yield pending[start:start + self.packet].astype("<i2").tobytes()
        self._pending = pending[whole:]
        if last and self._pending.size:
            self.sent += self._pending.size
            yield self._pending.astype("<i2").tobytes()
            self._pending = np.zeros(0, dtype=np.int16)

    def _resampled(self, samples: "np.ndarray[tuple[int], np.dtype[np.int16]]",
                   last: bool) -> "np.ndarray[tuple[int], np.dtype[np.int16]]":
        if self._stream is None:
            return samples
        out: np.ndarray[tuple[int], np.dtype[np.int16]] = self._stream.resample_chunk(
            samples, last=last)
        return out

    def feed(self, pcm: bytes) -> Iterator[bytes]:
        """The whole packets ready after `pcm` (S16LE at `rate`)."""
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.int16)
        yield from self._out(self._resampled(samples, False), False)

    def close(self) -> Iterator[bytes]:
        """What is left: the resampler's tail and the last packet."""
        yield from self._out(self._resampled(np.zeros(0, dtype=np.int16), True), True)


def resample(pcm: bytes, rate: int) -> bytes:
    """All of `pcm` (S16LE at `rate`) at RATE, in one piece."""
    packets = Packets(rate)
    return b"".join([*packets.feed(pcm), *packets.close()])
