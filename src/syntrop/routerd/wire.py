"""HTTP/1.1 framing for routerd's ingress and its upstream client: messages
parsed by httptools (llhttp, the C parser of Node.js), heads written here.

Why not h11: h11 is pure Python, and parsing and validating the four heads
of a proxied request (client → routerd → upstream and back) was half of
routerd's CPU per request, 120 µs of 260 (docs/BENCHMARKS.md). llhttp
parses a head in about a microsecond; what it does not do (size caps,
keep-alive, 100-continue, framing of what we send) is the small rest below.

Header names come out lowercased; values as sent. Everything routerd writes
is checked for CR and LF, so no value can split a head.
"""

from collections.abc import Sequence

import httptools

Headers = list[tuple[bytes, bytes]]

#: The reason phrases routerd answers with (a missing one is sent empty).
REASONS = {100: b"Continue", 200: b"OK", 204: b"No Content", 400: b"Bad Request",
           401: b"Unauthorized", 403: b"Forbidden",
           404: b"Not Found", 405: b"Method Not Allowed", 408: b"Request Timeout",
           413: b"Content Too Large", 415: b"Unsupported Media Type",
           431: b"Request Header Fields Too Large",
           502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout"}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


class BadMessage(Exception):
    """A message that cannot be served: `status` says why (400, 413, 431)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Request:
    """One request as received: method and target as sent, headers with
    lowercased names, the whole body."""

    __slots__ = ("body", "headers", "http_1_0", "keep_alive", "method", "target")

    def __init__(self, method: bytes, target: bytes, headers: Headers, body: bytes,
                 keep_alive: bool, http_1_0: bool) -> None:
        self.method, self.target, self.headers, self.body = method, target, headers, body
        self.keep_alive, self.http_1_0 = keep_alive, http_1_0

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


class RequestReader:
    """Bytes in, whole requests out (`ready`, pipelined ones in order).

    A head over `max_head` bytes is a 431, a body over `max_body` a 413
    (known from Content-Length before any of it is read), malformed HTTP a
    400; the error is raised by `failure()` once the requests before it
    have been taken. `close()` when the connection ends: the parser and
    this reader refer to each other, and would wait for the cyclic GC."""

    __slots__ = ("_body", "_failure", "_head_bytes", "_head_parts", "_headers", "_parser",
                 "_size", "_upgraded", "_url", "expects_continue", "head_done", "in_message",
                 "max_body", "max_head", "ready")

    def __init__(self, max_head: int, max_body: int) -> None:
        self.max_head, self.max_body = max_head, max_body
        #: Whole requests, oldest first (more than one when pipelined).
        self.ready: list[Request] = []
        #: A message has begun and is not complete.
        self.in_message = False
        #: Its head is complete (its body is being read).
        self.head_done = False
        #: Its client waits for "100 Continue" before sending the body.
        self.expects_continue = False
        self._failure: BadMessage | None = None
        self._upgraded = False
        self._head_bytes = 0
        #: The current head's URL and headers so far, in bytes.
        self._head_parts = 0
        self._url: list[bytes] = []
        self._headers: Headers = []
        self._body: list[bytes] = []
        self._size = 0
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)

    def close(self) -> None:
        self._parser = None
        self._upgraded = True  # nothing more is read
        if self._failure is not None:  # its traceback's frames refer to this reader
            self._failure.__traceback__ = None

    @property
    def closed(self) -> bool:
        """Nothing more can be read from this connection: a failure, or an
        upgrade (served as a plain request, then the connection ends)."""
        return self._failure is not None or self._upgraded

    def feed(self, data: bytes) -> None:
        if self.closed or self._parser is None:
            return
        if not self.head_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:
            context = error.__context__
            self._failure = context if isinstance(context, BadMessage) else \
                BadMessage(400, f"malformed HTTP: {context}")
        except httptools.HttpParserUpgrade:
            self._upgraded = True
        except httptools.HttpParserError as error:
            self._failure = BadMessage(400, f"malformed HTTP: {error}")
        if self._failure is None and not self.head_done and self._head_bytes > self.max_head:
            self._failure = BadMessage(431, f"the request head is over {self.max_head} bytes")

    def failure(self) -> BadMessage | None:
        return self._failure

    # httptools' callbacks ---------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self._head_parts = 0

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._head_size(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._head_size(len(name) + len(value) + 4)

    def _head_size(self, more: int) -> None:
        """Count a head's parts: one read may hold a whole head, over
        `max_head` or not, before `feed` can look."""
        self._head_parts += more
        if self._head_parts > self.max_head:
            raise BadMessage(431, f"the request head is over {self.max_head} bytes")

    def on_headers_complete(self) -> None:
        self.head_done = True
        self._head_bytes = 0
        for name, value in self._headers:
            if name == b"content-length" and int(value) > self.max_body:
                raise BadMessage(413, f"the request body is over {self.max_body} bytes")
            if name == b"expect" and value.lower() == b"100-continue":
                self.expects_continue = True

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.max_body:
            raise BadMessage(413, f"the request body is over {self.max_body} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self.ready.append(Request(
            parser.get_method(), b"".join(self._url), self._headers, body,
            parser.should_keep_alive(), parser.get_http_version() == "1.0"))
        self._url, self._headers, self._body, self._size = [], [], [], 0
        self.in_message = self.head_done = self.expects_continue = False


class ResponseReader:
    """An upstream's response to one request: status and headers once
    `head_done`, body parts in `parts` as they come, `done` at its end.
    `feed(b"")` says the connection ended (the end of a body framed by
    the connection's close, else an error). The parser is let go at the
    end: it and this reader refer to each other."""

    __slots__ = ("_head_bytes", "_informational", "_parser", "done", "framed", "head_done",
                 "headers", "max_head", "parts", "reusable", "status")

    def __init__(self, max_head: int = 65536) -> None:
        self.max_head = max_head
        self.status = 0
        self.headers: Headers = []
        self.head_done = False
        self.done = False
        #: The connection may carry another exchange after this one.
        self.reusable = False
        self.parts: list[bytes] = []
        self._informational = False
        #: Its body's end is known (a length, chunks, or no body): not the
        #: connection's close.
        self.framed = False
        self._head_bytes = 0
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)

    def feed(self, data: bytes) -> None:
        """Raises ValueError for a malformed or cut-short response."""
        if self.done or self._parser is None:
            self.reusable = False  # bytes nobody asked for: not reusable
            return
        if not data:
            if self.head_done and not self.framed:
                self.done = True  # its body ran to the connection's end
                self._parser = None
                return
            raise ValueError("the connection closed " + (
                "mid-response" if self.head_done else "without an answer"))
        if not self.head_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            if not self.done:
                self._parser = None
                raise ValueError(str(error.__context__ if isinstance(
                    error, httptools.HttpParserCallbackError) else error)
                    or type(error).__name__) from None
            self.reusable = False  # garbage after the response
        if self.done:
            self._parser = None
        elif not self.head_done and self._head_bytes > self.max_head:
            raise ValueError(f"a response head over {self.max_head} bytes")

    def on_message_begin(self) -> None:
        if self.done:
            raise ValueError("a second response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # "100 Continue" and the like: the answer follows
            self._informational = True
            self.headers = []
            return
        self.status, self.head_done = status, True
        self.framed = status in (204, 304) or any(
            name in (b"content-length", b"transfer-encoding") for name, _ in self.headers)

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        assert self._parser is not None
        self.done = True
        self.reusable = self._parser.should_keep_alive()

    def take(self) -> bytes:
        """The body bytes come since the last take."""
        parts, self.parts = self.parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)


def _line(name: bytes, value: bytes) -> bytes:
    if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
        raise ValueError(f"a header that would split the head: {name!r}")
    return name + b": " + value + b"\r\n"


def response_head(status: int, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """A response's status line and headers (framing headers included by
    the caller), up to the blank line."""
    return b"".join((b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"")),
                     *[_line(name, value) for name, value in headers], b"\r\n"))


def request_head(method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]]
                 ) -> bytes:
    if b" " in target or b"\r" in target or b"\n" in target:
        raise ValueError(f"a request target with a space or line break: {target!r}")
    return b"".join((method, b" ", target, b" HTTP/1.1\r\n",
                     *[_line(name, value) for name, value in headers], b"\r\n"))


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body (empty data: nothing, since an
    empty chunk would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""
