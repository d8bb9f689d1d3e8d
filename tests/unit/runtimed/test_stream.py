"""How runtimed's streams leave the event loop: pieces that queue up while
a reply is out go as one reply (text and token counts kept, order kept),
thinking pieces stay apart, and the last chunk comes last."""

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from syntrop.config import Paths
from syntrop.runtimed.config import Config
from syntrop.runtimed.engine import Emit, Think
from syntrop.runtimed.service import RuntimeService
from syntrop.varlink import InvalidParameter

PIECES = 2000


def test_queued_pieces_leave_together(tmp_path: Path) -> None:
    service = RuntimeService(Paths(runtime=tmp_path, state=tmp_path, cache=tmp_path,
                                   configuration=tmp_path), Config())

    def work(stop: threading.Event, emit: Emit, first: Any, think: Think) -> str:
        think("hm", 1)
        think("", 1)  # a marker: no text, one token
        for i in range(PIECES):  # faster than the loop can send one reply each
            emit(f"{i},", 1)
        return "length"

    async def main() -> list[Any]:
        return [reply.parameters["chunk"] async for reply in
                service._stream(work, lambda: None, time.monotonic())]

    chunks = asyncio.run(main())
    assert [c.thinking for c in chunks[:2]] == [True, True]
    assert [(c.text, c.tokens) for c in chunks[:2]] == [("hm", 1), ("", 1)]
    answer = chunks[2:-1]
    assert "".join(c.text for c in answer) == "".join(f"{i}," for i in range(PIECES))
    assert sum(c.tokens for c in answer) == PIECES
    assert len(answer) < PIECES
    assert chunks[-1].finish_reason == "length" and all(c.finish_reason is None
                                                        for c in chunks[:-1])


def test_an_error_after_queued_pieces_still_ends_the_stream(tmp_path: Path) -> None:
    """Pieces ahead of an error go out (merged), then the declared error."""
    service = RuntimeService(Paths(runtime=tmp_path, state=tmp_path, cache=tmp_path,
                                   configuration=tmp_path), Config())

    def work(stop: threading.Event, emit: Emit, first: Any, think: Think) -> str:
        for i in range(PIECES):
            emit(f"{i},", 1)
        raise InvalidParameter(parameter="prompt")

    async def main() -> tuple[str, BaseException | None]:
        text = ""
        try:
            async for reply in service._stream(work, lambda: None, time.monotonic()):
                text += reply.parameters["chunk"].text
        except InvalidParameter as error:
            return text, error
        return text, None

    text, error = asyncio.run(main())
    assert text == "".join(f"{i}," for i in range(PIECES))
    assert isinstance(error, InvalidParameter) and error.parameters["parameter"] == "prompt"
