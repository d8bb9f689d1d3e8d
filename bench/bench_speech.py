#!/usr/bin/env python3
"""Runtime1.Speak: time to the first packet and real-time factor, beside
the synthesizer called in this process, in the same run.

A node (modeld and runtimed, socket-activated, as the service tests start
them) with the packaged voice `joe` registered and loaded once before the
clock runs. Each round times, interleaved (the order alternating):

- Speak: the call sent over Varlink to the first packet's arrival (first
  packet), and to the last reply (total); real-time factor = total /
  seconds of speech received.
- in process: PiperVoice loaded here from the same files, `synthesize` to
  its first chunk (first packet: the first sentence's audio), and to its
  last (no resampling, no packets: the floor).

Texts: one sentence of 20 words (the first packet waits for all of it),
and the same 20 words in three sentences (it waits for the first).
Bounded by --rounds and --seconds. Needs the voice and the synthesizer
(the runtimed extra).

    python bench/bench_speech.py [--rounds N] [--seconds S]
"""

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.service.runtimed_node import Node, started

from syntrop import packaged

TEXTS = {
    "one sentence": "The quick brown fox jumps over the lazy dog while the children in the "
                    "sunny park smile and wave at everyone.",
    "three sentences": "The quick brown fox jumps over the lazy dog. It was a sunny day in "
                       "the park. Everyone smiled and waved.",
}
RATE = 24_000


async def _speak(node: Node, text: str) -> tuple[float, float, float]:
    """(first packet, total, seconds of speech) of one Speak."""
    async with await node.runtimed() as runtime:
        start = time.perf_counter()
        first, samples = 0.0, 0
        async for reply in runtime.Speak(model="joe", text=text):
            packet = reply["packet"] if isinstance(reply, dict) else reply
            if not first:
                first = time.perf_counter() - start
            samples += packet.samples
        return first, time.perf_counter() - start, samples / RATE


def _in_process(voice: Any, text: str) -> tuple[float, float, float]:
    start = time.perf_counter()
    first, samples = 0.0, 0
    for chunk in voice.synthesize(text):
        if not first:
            first = time.perf_counter() - start
        samples += len(chunk.audio_int16_bytes) // 2
    return first, time.perf_counter() - start, samples / voice.config.sample_rate


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args()
    path = packaged.locate(packaged.JOE)
    config = packaged.config_of(packaged.JOE.sha256)
    if path is None or config is None:
        print("the packaged voice is not installed", file=sys.stderr)
        return 1
    from piper import PiperVoice

    voice = PiperVoice.load(path, config_path=config)
    print(f"CPU: {_cpu()}, {os.cpu_count()} cores; load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as root, started(Path(root) / "node") as node:
        async def register() -> None:
            async with await node.modeld() as modeld:
                await modeld.Register(name="joe", path=str(path), sha256=packaged.JOE.sha256)
            await _speak(node, "Hello.")  # loaded before the clock runs
        node.run(register())
        _in_process(voice, "Hello.")
        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        deadline = time.monotonic() + args.seconds
        rounds = 0
        while rounds < args.rounds and time.monotonic() < deadline:
            for label, text in TEXTS.items():
                ways = ["Speak", "in process"]
                for way in ways if rounds % 2 == 0 else ways[::-1]:
                    run = node.run(_speak(node, text)) if way == "Speak" else \
                        _in_process(voice, text)
                    results.setdefault((label, way), []).append(run)
            rounds += 1
    print(f"{rounds} rounds; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| text | way | first packet p50 | p99 | total p50 | speech | real-time factor |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (label, way), runs in results.items():
        firsts = [r[0] * 1000 for r in runs]
        totals = [r[1] for r in runs]
        speech = statistics.median(r[2] for r in runs)
        rtf = statistics.median(r[1] / r[2] for r in runs)
        print(f"| {label} | {way} | {_p(firsts, 0.5):.0f} ms | {_p(firsts, 0.99):.0f} ms | "
              f"{statistics.median(totals) * 1000:.0f} ms | {speech:.2f} s | {rtf:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
