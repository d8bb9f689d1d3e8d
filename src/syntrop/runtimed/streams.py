"""A worker's stream events out as Varlink replies.

Each `piece` a worker sends goes out at once as a `more` reply (`continues`
true); pieces that queued up while the previous reply was being written
leave together as one reply, so a loop that falls behind the engine catches
up instead of lagging further (thinking pieces stay apart: a marker's empty
piece carries its token count on its own). The `done` event becomes the
last chunk, with the finish reason and the call's counts. A piece's
logprob entries (when the stream asked for them) become its chunk's
TokenLogprobs; pieces sent as one reply join theirs.

What the call holds (its slot, its model) is given back by `done`, exactly
once: before the last reply goes out when the worker finishes (so the
client's next call finds the slot free), or, when the client leaves first,
once the worker has stopped the cancelled call (or died).

Speech (Speak) has a relay of its own, `relay_speech`: each `audio` piece
(one packet of PCM, base64) goes out as a reply of its own, never joined,
so a packet stays 20 ms at most.

Tracing: with a trace file, each stream appends one JSON line of
CLOCK_MONOTONIC times (system-wide, so the worker's count too): the call's
arrival, the engine starting on it and sampling its first token (in the
worker), the first reply written.
"""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import fields, replace
from typing import Any

from asyncvarlink import AnnotatedResult

from syntrop.interfaces.runtime import Chunk, SpeechPacket, TokenLogprob, TopLogprob
from syntrop.runtimed import protocol
from syntrop.runtimed.protocol import SPEECH_RATE as RATE
from syntrop.runtimed.supervisor import Call, Gone, WorkerProcess

#: The counts a last chunk may carry.
EXTRA = frozenset(f.name for f in fields(Chunk)) - {"text", "tokens", "finish_reason",
                                                    "thinking", "logprobs"}


def _top(entry: dict[str, Any]) -> TopLogprob:
    return TopLogprob(token=str(entry["token"]), logprob=float(entry["logprob"]),
                      bytes=[int(b) for b in entry["bytes"]])


def logprobs(entries: list[dict[str, Any]] | None) -> list[TokenLogprob] | None:
    """A piece's logprob entries (logprobs.Entry) as the contract's."""
    if entries is None:
        return None
    return [TokenLogprob(token=str(e["token"]), logprob=float(e["logprob"]),
                         bytes=[int(b) for b in e["bytes"]],
                         top=[_top(t) for t in e.get("top") or ()]) for e in entries]


def _chunk(piece: protocol.Piece) -> Chunk:
    return Chunk(text=piece.text, tokens=piece.tokens, finish_reason=None,
                 thinking=True if piece.kind == "think" else None,
                 logprobs=logprobs(piece.logprobs))


def join(first: Chunk, second: Chunk) -> Chunk:
    """Two answer chunks as one reply."""
    entries = first.logprobs
    if second.logprobs is not None:
        entries = (entries or []) + second.logprobs
    return replace(first, text=first.text + second.text, tokens=first.tokens + second.tokens,
                   logprobs=entries)


def _note_first(times: dict[str, float], first: dict[str, float]) -> None:
    times.update(worker_received=float(first.get("received", 0.0)),
                 engine_start=float(first.get("started", 0.0)),
                 first_token=float(first.get("at", 0.0)), first_seen=time.monotonic())


def _last(result: dict[str, Any]) -> Chunk:
    """The closing chunk: no text, the finish reason and the result's extras."""
    extra = {k: v for k, v in result.items() if k in EXTRA}
    return Chunk(text="", tokens=0, finish_reason=str(result.get("reason", "stop")), **extra)


_Event = tuple[protocol.Reply | Gone, list[int]]


def _coalesced(chunk: Chunk, queue: "asyncio.Queue[_Event]") -> tuple[Chunk, _Event | None]:
    """Answer pieces queued while the last reply went out, as one reply;
    and the first other event, held for the next turn."""
    while chunk.thinking is None and not queue.empty():
        following = queue.get_nowait()
        if not isinstance(following[0], protocol.Piece) or following[0].kind != "piece":
            return chunk, following
        chunk = join(chunk, _chunk(following[0]))
    return chunk, None


async def relay(worker: WorkerProcess, call: Call, *, done: Callable[[], None], received: float,
                trace: str | None = None, on_text: Callable[[str], None] | None = None,
                on_result: Callable[[dict[str, Any]], None] | None = None,
                ) -> AsyncIterator[AnnotatedResult]:
    """Stream `call`'s events as replies (see the module's docstring);
    `on_text` sees the answer's text, `on_result` the worker's result."""
    times = {"received": received, "sent": call.sent}
    given_back = False

    def give_back(*_: object) -> None:
        nonlocal given_back
        if not given_back:
            given_back = True
            done()

    def late(*_: object) -> None:
        """The worker has ended a call the client left: its result (a
        cancelled Decode's counts), if it sent one, then give back."""
        while not queue.empty():
            message, _fds = queue.get_nowait()
            if isinstance(message, protocol.Done) and on_result is not None:
                on_result(dict(message.result))
        give_back()

    queue = call.events
    try:
        held: _Event | None = None
        while True:
            item = held if held is not None else await queue.get()
            held = None
            message, _ = item
            first = None if isinstance(message, Gone) else message.first
            if first is not None:  # the engine's first-token times ride along
                _note_first(times, first)
            if isinstance(message, protocol.Failed | Gone):
                give_back()
                raise worker.error(message)
            if isinstance(message, protocol.Done):
                result = dict(message.result)
                if on_result is not None:
                    on_result(result)
                give_back()
                yield AnnotatedResult({"chunk": _last(result)}, continues=False)
                return
            chunk, held = _coalesced(_chunk(message), queue)
            if on_text is not None and chunk.thinking is None:
                on_text(chunk.text)
            yield AnnotatedResult({"chunk": chunk}, continues=True)
            times.setdefault("first_sent", time.monotonic())
    finally:
        if not given_back:
            worker.cancel(call)
            if call.finished.done():
                late()
            else:
                call.finished.add_done_callback(late)
        if trace:
            with contextlib.suppress(OSError), open(trace, "a") as file:
                file.write(json.dumps(times) + "\n")



def _packet(piece: protocol.Piece) -> SpeechPacket:
    """An audio piece as a packet: its samples counted from the base64."""
    size = len(piece.text) * 3 // 4 - (len(piece.text) - len(piece.text.rstrip("=")))
    return SpeechPacket(audio=piece.text, samples=size // 2, sample_rate=RATE,
                        sentence=piece.tokens)


async def relay_speech(worker: WorkerProcess, call: Call, *, done: Callable[[], None],
                       ) -> AsyncIterator[AnnotatedResult]:
    """Stream a Speak call's packets as replies, one each, as they come;
    the last reply has no audio and the total. `done` runs once, when the
    worker is done with the call (at once, or after a cancel it asked for
    when the client left)."""
    finished = False
    try:
        while True:
            message, _ = await call.events.get()
            if isinstance(message, protocol.Failed | Gone):
                finished = True
                done()
                raise worker.error(message)
            if isinstance(message, protocol.Done):
                finished = True
                done()
                total = int(message.result.get("total_samples", 0))
                yield AnnotatedResult({"packet": SpeechPacket(
                    audio="", samples=0, sample_rate=RATE, sentence=-1, total_samples=total)},
                    continues=False)
                return
            yield AnnotatedResult({"packet": _packet(message)}, continues=True)
    finally:
        if not finished:
            worker.cancel(call)
            if call.finished.done():
                done()
            else:
                call.finished.add_done_callback(lambda _: done())
