"""Runtime1.Speak over runtimed's socket: the packaged voice registered in
a real modeld, run in an engine worker, its speech streamed in 20 ms
packets of 24 kHz PCM while later sentences are still being made.
Skipped where the voice or the synthesizer is not installed."""

import asyncio
import base64
import importlib.util
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop import packaged
from syntrop.interfaces.runtime import (
    EngineCrashed,
    EngineWorker,
    InvalidModel,
    ModelNotFound,
    NotAVoice,
)
from tests.service.runtimed_node import Node, started

pytestmark = pytest.mark.service

if importlib.util.find_spec("piper") is None or not packaged.installed(packaged.JOE):
    pytest.skip("the speech synthesizer or the packaged voice is not installed",
                allow_module_level=True)

INVALID_PARAMETER = "org.varlink.service.InvalidParameter"
#: Twenty words in three sentences.
TEXT = ("The quick brown fox jumps over the lazy dog. It was a sunny day in the park. "
        "Everyone smiled and waved.")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    path = packaged.locate(packaged.JOE)
    assert path is not None
    with started(tmp_path / "node") as node:
        async def register() -> None:
            async with await node.modeld() as modeld:
                await modeld.Register(name="joe", path=str(path), sha256=packaged.JOE.sha256)
        node.run(register())
        yield node


def _packet(reply: Any) -> Any:
    return reply["packet"] if isinstance(reply, dict) else reply


def test_speak_streams_packets_sentence_by_sentence(node: Node) -> None:
    async def main() -> tuple[float, list[tuple[float, Any]]]:
        async with await node.runtimed() as runtime:
            # Loaded once first, so the timing below is the speech's.
            async for _ in runtime.Speak(model="joe", text="Hello."):
                pass
            received: list[tuple[float, Any]] = []
            start = time.monotonic()
            async for reply in runtime.Speak(model="joe", text=TEXT):
                received.append((time.monotonic() - start, _packet(reply)))
            return start, received

    _, received = node.run(main())
    *packets, (_, last) = received
    assert last.audio == "" and last.samples == 0
    pcm = [base64.b64decode(p.audio) for _, p in packets]
    assert all(p.sample_rate == 24_000 for _, p in packets)
    assert all(0 < len(b) <= 960 and len(b) % 2 == 0 for b in pcm)
    assert all(len(b) == 2 * p.samples for b, (_, p) in zip(pcm, packets, strict=True))
    total = sum(len(b) for b in pcm) // 2
    assert last.total_samples == total
    assert total / 24_000 > 1.0  # twenty words take seconds to say
    sentences = [p.sentence for _, p in packets]
    assert sentences == sorted(sentences) and sentences[-1] >= 2
    # The first packet comes before the last sentence's: the stream is
    # sentence by sentence (how soon is bench_speech's figure, not a test's).
    first_of_last = next(t for t, p in packets if p.sentence == sentences[-1])
    first = packets[0][0]
    assert first < first_of_last
    print(f"first packet after {first * 1000:.0f} ms, {len(packets)} packets, "
          f"{total / 24_000:.2f} s of speech in {received[-1][0]:.2f} s")


def test_bad_input_gets_the_declared_errors(node: Node) -> None:
    async def main() -> None:
        async with await node.runtimed() as runtime:
            for text in ("", "   ", "x" * 4097):
                with pytest.raises(VarlinkErrorReply) as caught:
                    async for _ in runtime.Speak(model="joe", text=text):
                        pass
                assert caught.value.name == INVALID_PARAMETER
                assert caught.value.paramstojson() == {"parameter": "text"}
            with pytest.raises(VarlinkErrorReply) as caught:
                async for _ in runtime.Speak(model="joe", text="Hi.", speed=9.0):
                    pass
            assert caught.value.paramstojson() == {"parameter": "speed"}
            with pytest.raises(ModelNotFound):
                async for _ in runtime.Speak(model="nobody", text="Hello."):
                    pass
            with pytest.raises(NotAVoice):
                async for _ in runtime.Speak(model="smollm2", text="Hello."):
                    pass
            with pytest.raises(InvalidModel):  # and a voice is no language model
                async for _ in runtime.Complete(model="joe", prompt="Hello"):
                    pass
            # And the voice still speaks.
            count = 0
            async for _ in runtime.Speak(model="joe", text="Still here."):
                count += 1
            assert count > 10

    node.run(main())


def test_concurrent_calls_each_get_their_whole_speech(node: Node) -> None:
    async def one(text: str) -> int:
        async with await node.runtimed() as runtime:
            samples = 0
            async for reply in runtime.Speak(model="joe", text=text):
                samples += _packet(reply).samples
            return samples

    async def main() -> list[int]:
        return list(await asyncio.gather(*(one(TEXT) for _ in range(3)), one("Hello.")))

    *same, short = node.run(main())
    assert same[0] > 24_000 and short < same[0]
    # The same text, about the same length (the voice's durations are drawn
    # with a little noise: a few percent apart from call to call).
    assert max(same) - min(same) <= max(same) // 7


def test_a_voice_crash_ends_only_its_call(node: Node) -> None:
    """The voice runs in an engine worker: killing it fails the call in
    flight with EngineCrashed; the next call starts a new one."""
    async def main() -> tuple[str, int]:
        async with await node.runtimed() as runtime:
            async for _ in runtime.Speak(model="joe", text="Hello."):
                pass
            engine = await runtime.GetEngine()
            worker: EngineWorker = next(w for w in engine["workers"] if w.model == "joe")
            assert worker.pid is not None
            with pytest.raises(EngineCrashed):
                async for _ in runtime.Speak(model="joe", text=TEXT * 20):
                    os.kill(worker.pid, signal.SIGSEGV)
            count = 0
            async for _ in runtime.Speak(model="joe", text="Still here."):
                count += 1
            again = next(w for w in (await runtime.GetEngine())["workers"] if w.model == "joe")
            return again.state, count

    state, count = node.run(main())
    assert state == "running" and count > 10
