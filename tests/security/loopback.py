"""A loopback HTTP server that records every request it gets and answers
with what the test gives it (status, headers, body)."""

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = tuple[int, dict[str, str], bytes]


@dataclass
class Recorder:
    port: int
    requests: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@contextlib.contextmanager
def serving(answer: Callable[[str], Answer]) -> Iterator[Recorder]:
    """`answer(path)` for each GET or HEAD, on 127.0.0.1, for the `with`."""
    recorder = Recorder(0)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body_too: bool) -> None:
            recorder.requests.append(f"{self.command} {self.path}")
            status, headers, body = answer(self.path)
            self.send_response(status)
            for key, value in {"content-length": str(len(body)), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            if body_too:
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(True)

        def do_HEAD(self) -> None:
            self._answer(False)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
