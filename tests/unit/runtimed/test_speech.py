"""speech.py: a voice's samples resampled to 24 kHz and cut into packets."""

import numpy as np
import pytest

from syntrop.runtimed.worker.speech import PACKET, RATE, Packets, resample

pytestmark = pytest.mark.unit

VOICE_RATE = 22_050


def _sine(frequency: float, seconds: float, rate: int) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * frequency * t) * 12_000).astype("<i2").tobytes()


def _close(a: bytes, b: bytes) -> bool:
    """Same length, and within a few steps of rounding sample by sample
    (the resampler's arithmetic differs a little with the chunking)."""
    x, y = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
    return x.size == y.size and int(np.abs(x - y).max(initial=0)) <= 4


def _peak(pcm: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm, "<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.argmax(spectrum)) * rate / samples.size


@pytest.mark.parametrize("frequency", [220.0, 440.0, 3_000.0, 8_000.0])
def test_a_sine_keeps_its_frequency(frequency: float) -> None:
    out = resample(_sine(frequency, 1.0, VOICE_RATE), VOICE_RATE)
    assert abs(_peak(out, RATE) - frequency) <= 2.0


def test_resampling_is_not_nearest_sample() -> None:
    """A real filter leaves little energy away from the tone; picking the
    nearest sample would leave images and jitter all over the spectrum."""
    out = np.frombuffer(resample(_sine(3_000.0, 1.0, VOICE_RATE), VOICE_RATE), "<i2")
    spectrum = np.abs(np.fft.rfft(out[1000:-1000] * np.hanning(out.size - 2000))) ** 2
    bin_hz = RATE / (out.size - 2000)
    tone = spectrum[int((3_000 - 50) / bin_hz):int((3_000 + 50) / bin_hz)].sum()
    assert tone / spectrum.sum() > 0.999


def test_packets_are_in_order_at_most_20_ms_and_the_length_is_right() -> None:
    ramp = (np.arange(VOICE_RATE * 2) % 20_000).astype("<i2")
    packets = Packets(VOICE_RATE)
    out: list[bytes] = []
    # Sentences of uneven lengths, as a voice gives them.
    for start, end in [(0, 7_001), (7_001, 7_002), (7_002, 30_000), (30_000, ramp.size)]:
        out += packets.feed(ramp[start:end].tobytes())
    out += packets.close()
    assert all(0 < len(p) <= PACKET * 2 and len(p) % 2 == 0 for p in out)
    assert all(len(p) == PACKET * 2 for p in out[:-1])
    total = sum(len(p) for p in out) // 2
    assert total == packets.sent
    assert abs(total - ramp.size * RATE / VOICE_RATE) <= 2
    # In order: the whole equals resampling everything at once.
    assert _close(b"".join(out), resample(ramp.tobytes(), VOICE_RATE))


def test_streaming_has_no_seam_between_sentences() -> None:
    """The filter's state carries across feeds: a sine fed in pieces is
    the sine fed whole."""
    pcm = _sine(440.0, 1.0, VOICE_RATE)
    packets = Packets(VOICE_RATE)
    pieces = [pcm[i:i + 4_410] for i in range(0, len(pcm), 4_410)]
    out = b"".join([p for piece in pieces for p in packets.feed(piece)] + list(packets.close()))
    assert _close(out, resample(pcm, VOICE_RATE))


def test_the_output_rate_passes_through() -> None:
    pcm = _sine(440.0, 0.1, RATE)
    assert resample(pcm, RATE) == pcm


def test_nothing_in_nothing_out() -> None:
    packets = Packets(VOICE_RATE)
    assert list(packets.feed(b"")) == []
    assert list(packets.close()) == [] or packets.sent < PACKET


def test_an_onnx_voice_is_a_model_file() -> None:
    """modeld stores a voice: its first bytes say ONNX (modelfile)."""
    import io

    from syntrop import modelfile

    head = b"\x08\x08\x12\x07pytorch\x1a\x052.0.0"
    assert modelfile.read(io.BytesIO(head)).format == "onnx"
    with pytest.raises(modelfile.InvalidModel):
        modelfile.read(io.BytesIO(b"\x08\x40\x00\x00\x00\x00\x00\x00{}"))


def test_a_packaged_voice_has_its_config_by_digest() -> None:
    from syntrop import packaged

    assert packaged.JOE in packaged.KNOWN and packaged.JOE not in packaged.DEFAULTS
    assert packaged.config_of("0" * 64) is None
    if packaged.installed(packaged.JOE):
        config = packaged.config_of(packaged.JOE.sha256.upper())
        assert config is not None and config.name.endswith(".onnx.json")


def test_syn_pull_knows_the_packaged_voice() -> None:
    """`syn pull packaged:joe` registers the voice's ONNX file, pinned."""
    import argparse

    from syntrop import packaged
    from syntrop.cli import pulling

    if not packaged.installed(packaged.JOE):
        pytest.skip("the packaged voice is not installed")
    args = argparse.Namespace(reference="packaged:joe", name=None)
    path = pulling._packaged(args)
    assert path.endswith(".onnx")
    assert (args.name, args.sha256, args.pin) == ("joe", packaged.JOE.sha256, True)
