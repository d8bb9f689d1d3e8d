"""How runtimed relays a worker's stream (streams.py): pieces that queue up
while a reply is out go as one reply (text and token counts kept, order
kept), thinking pieces stay apart, the last chunk comes last, and what the
call holds is given back exactly once: before the last reply, or, when the
client leaves first, once the worker has ended the cancelled call. The
worker is a stand-in with the two methods the relay uses."""

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

from syntrop.runtimed import protocol
from syntrop.runtimed.streams import relay
from syntrop.runtimed.supervisor import Call, varlink_error

PIECES = 2000


class Worker:
    def __init__(self) -> None:
        self.cancelled: list[int] = []

    def cancel(self, call: Call) -> None:
        self.cancelled.append(call.id)

    def error(self, message: protocol.Failed) -> Exception:
        return varlink_error(message)


def queued(call: Call, *events: tuple[str, dict[str, Any]]) -> None:
    """Events as the worker's wire has them, decoded as the supervisor does."""
    for event, wire in events:
        message = protocol.decode({"id": call.id, "event": event, **wire})
        assert isinstance(message, protocol.Piece | protocol.Done | protocol.Failed)
        call.events.put_nowait((message, []))


def test_queued_pieces_leave_together() -> None:
    async def main() -> tuple[list[Any], list[str]]:
        call, log = Call(1, "generate", "Chat"), []
        queued(call, ("think", {"text": "hm", "tokens": 1}), ("think", {"text": "", "tokens": 1}),
               *(("piece", {"text": f"{i},", "tokens": 1}) for i in range(PIECES)),
               ("done", {"result": {"reason": "length", "thinking_tokens": 1}}))
        chunks = []
        async for reply in relay(Worker(), call, done=lambda: log.append("done"),  # type: ignore[arg-type]
                                 received=time.monotonic()):
            if not reply.continues:
                log.append("last")
            chunks.append(reply.parameters["chunk"])
        return chunks, log

    chunks, log = asyncio.run(main())
    assert log == ["done", "last"]  # the slot is free before the last reply goes out
    assert [c.thinking for c in chunks[:2]] == [True, True]
    assert [(c.text, c.tokens) for c in chunks[:2]] == [("hm", 1), ("", 1)]
    answer = chunks[2:-1]
    assert "".join(c.text for c in answer) == "".join(f"{i}," for i in range(PIECES))
    assert sum(c.tokens for c in answer) == PIECES
    assert len(answer) == 1  # all were queued: one reply
    assert chunks[-1].finish_reason == "length" and chunks[-1].thinking_tokens == 1
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_an_error_after_queued_pieces_still_ends_the_stream() -> None:
    """Pieces ahead of an error go out (merged), then the declared error."""
    async def main() -> tuple[str, BaseException | None, int]:
        call, given_back = Call(2, "generate", "Complete"), []
        queued(call, *(("piece", {"text": f"{i},", "tokens": 1}) for i in range(PIECES)),
               ("error", {"error": {"kind": "overflow",
                                    "parameters": {"tokens": 9, "n_ctx": 8}}}))
        text = ""
        try:
            async for reply in relay(Worker(), call, done=lambda: given_back.append(1),  # type: ignore[arg-type]
                                     received=time.monotonic()):
                text += reply.parameters["chunk"].text
        except Exception as error:
            return text, error, len(given_back)
        return text, None, len(given_back)

    from syntrop.interfaces.runtime import ContextOverflow

    text, error, given_back = asyncio.run(main())
    assert text == "".join(f"{i}," for i in range(PIECES))
    assert isinstance(error, ContextOverflow) and error.parameters["n_ctx"] == 8
    assert given_back == 1


def test_a_client_leaving_early_gives_back_when_the_worker_has_stopped() -> None:
    async def main() -> tuple[list[int], list[str]]:
        worker, call, log = Worker(), Call(3, "decode", "Decode"), []
        queued(call, ("piece", {"text": "a", "tokens": 1}))
        stream = relay(worker, call, done=lambda: log.append("given back"),  # type: ignore[arg-type]
                       received=time.monotonic(),
                       on_result=lambda result: log.append(f"result {result['reason']}"))
        assert isinstance(stream, AsyncGenerator)  # relay is an async generator function
        await anext(stream)
        await stream.aclose()  # the client went away
        log.append("closed")
        # The worker stops the cancelled call and says so; then it is over.
        queued(call, ("done", {"result": {"reason": "cancelled"}}))
        call.finish()
        await asyncio.sleep(0)
        return worker.cancelled, log

    cancelled, log = asyncio.run(main())
    assert cancelled == [3]
    assert log == ["closed", "result cancelled", "given back"]
