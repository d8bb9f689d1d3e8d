"""Loopback OpenAI-style upstreams for routerd's tests: the h11 plumbing
every fake upstream needs, so a test writes only what its upstream answers.

- `read_request` reads one request (head and body) off an h11 connection;
- `send_json` answers one with a JSON body;
- `serving(handler)` runs an asyncio server of `handler(conn, request, body,
  writer)` on a free loopback port in a thread, for the life of a `with`.
"""

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import h11

Handler = Callable[[h11.Connection, h11.Request, bytes, asyncio.StreamWriter], Awaitable[bool]]


async def read_request(conn: h11.Connection, reader: asyncio.StreamReader,
                       ) -> tuple[h11.Request, bytes] | None:
    """The next request and its body; None when the client is gone or the
    connection cannot go on."""
    request, body = None, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            if not data:
                return None
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return (request, body) if request is not None else None
        else:
            return None


def send_json(conn: h11.Connection, writer: asyncio.StreamWriter, payload: Any,
              status: int = 200) -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    writer.write(conn.send(h11.Response(status_code=status, headers=[
        ("content-type", "application/json"), ("content-length", str(len(data)))]))
        + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))


async def _connection(handler: Handler, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while (got := await read_request(conn, reader)) is not None:
            if not await handler(conn, got[0], got[1], writer):
                return
            await writer.drain()
            conn.start_next_cycle()
    except (OSError, h11.ProtocolError):
        pass
    finally:
        writer.close()


@contextmanager
def serving(handler: Handler) -> Iterator[int]:
    """Serve `handler` on 127.0.0.1 in a thread; yields the port. The
    handler answers one request and returns whether the connection goes on."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []
    stop = asyncio.Event()

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _connection(handler, r, w),
                                            "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        async with server:
            await stop.wait()
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.01)  # let the transports close

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    ready.wait(5)
    try:
        yield port[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
        loop.close()


# an OpenAI-style upstream of routerd's tests ------------------------------------


def _chat(model: str, text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}]}


def _chunk(model: str, text: str) -> str:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                       "model": model, "choices": [{"index": 0, "delta": {"content": text},
                                                    "finish_reason": None}]})


async def _answer(conn: h11.Connection, request: h11.Request, body: bytes,
                  writer: asyncio.StreamWriter) -> bool:
    """/<name>/v1/…: answers as <name>; /garbage, /hang and /broken misbehave."""
    kind, _, path = request.target.decode().partition("/v1")
    if kind == "/garbage":
        writer.write(b"this is not HTTP at all\r\n\r\n")
        return False
    if kind == "/hang":
        await asyncio.sleep(10)
        return False
    if kind == "/broken":
        send_json(conn, writer, b'{"error": {"message": "boom"}}', status=500)
    elif kind == "/echo":  # the request as received, as the answer's content
        send_json(conn, writer, _chat("e", body.decode()))
    elif path == "/models":
        send_json(conn, writer, {"object": "list", "data": [
            {"id": "discovered", "object": "model"}]})
    else:
        decoded = json.loads(body)
        model = decoded["model"]
        if decoded.get("stream"):
            writer.write(conn.send(h11.Response(status_code=200, headers=[
                ("content-type", "text/event-stream")])))
            for word in ("Hello", ", ", "world"):
                writer.write(conn.send(h11.Data(
                    data=f"data: {_chunk(model, word)}\n\n".encode())))
                await writer.drain()
            writer.write(conn.send(h11.Data(data=b"data: [DONE]\n\n"))
                         + conn.send(h11.EndOfMessage()))
        else:
            send_json(conn, writer, _chat(model, f"{kind[1:]} answers"))
    return True


def openai_upstream() -> AbstractContextManager[int]:
    """An OpenAI-style server on a free loopback port, in a thread: a path
    /<name>/v1/… answers as <name> ("<name> answers", streamed or not);
    /garbage, /hang and /broken misbehave, /echo answers the request."""
    return serving(_answer)
