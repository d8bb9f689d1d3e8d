"""routerd's HTTP/1.1 framing (routerd/wire.py): requests and responses as
they arrive, in any pieces, against what h11 (another implementation) makes
of the same bytes; the caps; what routerd writes."""

import itertools

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from syntrop.routerd.wire import (
    BadMessage,
    RequestReader,
    ResponseReader,
    chunk,
    request_head,
    response_head,
)

POST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 11\r\n\r\n{\"a\": true}")
CHUNKED = (b"POST /v1/completions?x=1 HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
           b"4\r\n{\"a\"\r\n5\r\n: 1}\n\r\n0\r\n\r\n")
GET_CLOSE = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _h11_requests(data: bytes) -> list[tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes]]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    found, body, head = [], b"", None
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            head, body = event, b""
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            found.append((head.method, head.target, list(head.headers), body))
            conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
            conn.send(h11.EndOfMessage())
            if conn.our_state is not h11.DONE:
                break  # the client asked to close
            conn.start_next_cycle()
        else:
            break
    return found


@given(st.lists(st.integers(min_value=0), max_size=8))
def test_requests_in_any_pieces_parse_as_h11_parses_them(cuts: list[int]) -> None:
    """Three pipelined requests (a length, chunks, none), cut anywhere:
    the same methods, targets, lowercased headers and bodies as h11's."""
    data = POST + CHUNKED + GET_CLOSE
    reader = RequestReader(16384, 1 << 20)
    for piece in _split(data, cuts):
        reader.feed(piece)
    assert reader.failure() is None
    got = [(r.method, r.target, r.headers, r.body) for r in reader.ready]
    assert got == _h11_requests(data)
    assert [r.keep_alive for r in reader.ready] == [True, True, False]
    assert reader.ready[0].header(b"content-type") == b"application/json"
    assert not reader.in_message and not reader.head_done


def test_a_request_is_ready_only_when_its_body_is_whole() -> None:
    reader = RequestReader(16384, 1 << 20)
    reader.feed(POST[:-3])
    assert reader.head_done and not reader.ready
    reader.feed(POST[-3:])
    assert [r.body for r in reader.ready] == [b'{"a": true}']


@pytest.mark.parametrize("junk", [
    b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
    b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n",
    b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: x\r\n transfer-encoding: chunked\r\n\r\n",
])
def test_malformed_requests_are_400s(junk: bytes) -> None:
    reader = RequestReader(16384, 1 << 20)
    reader.feed(junk)
    failure = reader.failure()
    assert failure is not None and failure.status == 400, failure
    assert reader.closed
    reader.feed(GET_CLOSE)  # nothing more is read after a failure
    assert not reader.ready


def test_requests_before_a_malformed_one_are_served_first() -> None:
    reader = RequestReader(16384, 1 << 20)
    reader.feed(POST + b"GARBAGE\r\n\r\n")
    assert len(reader.ready) == 1
    assert isinstance(reader.failure(), BadMessage)


def test_a_long_head_is_431_even_before_its_end() -> None:
    reader = RequestReader(1024, 1 << 20)
    reader.feed(b"GET / HTTP/1.1\r\nx-long: " + b"a" * 2000)
    failure = reader.failure()
    assert failure is not None and failure.status == 431
    within = RequestReader(1024, 1 << 20)
    within.feed(b"GET / HTTP/1.1\r\nx-long: " + b"a" * 900 + b"\r\n\r\n")
    assert within.failure() is None and len(within.ready) == 1



def test_a_whole_long_head_in_one_read_is_431() -> None:
    reader = RequestReader(1024, 1 << 20)
    reader.feed(b"GET / HTTP/1.1\r\nx-long: " + b"a" * 2000 + b"\r\n\r\n")
    failure = reader.failure()
    assert failure is not None and failure.status == 431
    assert not reader.ready
    # The count starts again with each request of a connection.
    many = RequestReader(1024, 1 << 20)
    many.feed(b"GET / HTTP/1.1\r\nx: " + b"a" * 600 + b"\r\n\r\n" * 1 +
              b"GET / HTTP/1.1\r\nx: " + b"a" * 600 + b"\r\n\r\n")
    assert many.failure() is None and len(many.ready) == 2


def test_a_refused_reader_lets_go_of_its_failures_traceback() -> None:
    """The traceback's frames refer to the reader (and, raised on, to the
    connection's buffers): kept, they would wait for the cyclic GC."""
    reader = RequestReader(16384, 5)
    reader.feed(CHUNKED)
    failure = reader.failure()
    assert failure is not None and failure.__traceback__ is not None
    reader.close()
    assert failure.__traceback__ is None


def test_a_body_over_the_cap_is_413_from_its_length_or_its_chunks() -> None:
    declared = RequestReader(16384, 10)
    declared.feed(POST[:POST.index(b"\r\n\r\n") + 4])  # no body byte yet
    failure = declared.failure()
    assert failure is not None and failure.status == 413
    chunked = RequestReader(16384, 5)
    chunked.feed(CHUNKED)
    failure = chunked.failure()
    assert failure is not None and failure.status == 413


def test_expect_100_continue_and_http_1_0_are_noted() -> None:
    reader = RequestReader(16384, 1 << 20)
    reader.feed(b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n")
    assert reader.expects_continue
    reader.feed(b"{}")
    assert not reader.expects_continue and reader.ready[0].body == b"{}"
    old = RequestReader(16384, 1 << 20)
    old.feed(b"GET /health HTTP/1.0\r\n\r\n")
    assert old.ready[0].http_1_0 and not old.ready[0].keep_alive


def test_an_upgrade_is_served_as_a_request_then_the_connection_ends() -> None:
    reader = RequestReader(16384, 1 << 20)
    reader.feed(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n")
    assert len(reader.ready) == 1 and reader.closed and reader.failure() is None


def _h11_response(status: int, headers: list[tuple[bytes, bytes]], parts: list[bytes],
                  close: bool = False) -> bytes:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n" + (b"connection: close\r\n" if close
                                                           else b"") + b"\r\n")
    conn.next_event()
    out = conn.send(h11.Response(status_code=status, headers=headers)) or b""
    for part in parts:
        out += conn.send(h11.Data(data=part)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


@given(st.lists(st.integers(min_value=0), max_size=6), st.booleans())
def test_responses_in_any_pieces(cuts: list[int], chunked: bool) -> None:
    """A body framed by its length or by chunks (as h11 writes them), cut
    anywhere: the status, the body whole, reusable."""
    parts = [b'{"choices": ', b"[]}"]
    headers = [(b"content-type", b"application/json")]
    if not chunked:
        headers.append((b"content-length", b"%d" % len(b"".join(parts))))
    data = _h11_response(200, headers, parts)
    response = ResponseReader()
    body = b""
    for piece in _split(data, cuts):
        response.feed(piece)
        body += response.take()
    assert (response.status, response.done, response.reusable) == (200, True, True)
    assert body == b"".join(parts)
    assert response.headers[0] == (b"content-type", b"application/json")


def test_a_body_to_the_connections_end() -> None:
    response = ResponseReader()
    response.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of ")
    response.feed(b"it")
    assert not response.done and not response.framed
    response.feed(b"")
    assert response.done and not response.reusable and response.take() == b"all of it"


def test_cut_short_malformed_and_extra_responses() -> None:
    cut = ResponseReader()
    cut.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
    with pytest.raises(ValueError, match="mid-response"):
        cut.feed(b"")
    with pytest.raises(ValueError):
        ResponseReader().feed(b"NOT HTTP\r\n\r\n")
    with pytest.raises(ValueError, match="without an answer"):
        ResponseReader().feed(b"")
    extra = ResponseReader()
    extra.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n\r\n")
    assert extra.done and not extra.reusable and extra.take() == b"ok"


def test_continue_before_the_answer_and_close() -> None:
    response = ResponseReader()
    response.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\n"
                  b"connection: close\r\ncontent-length: 2\r\n\r\nno")
    assert (response.status, response.take(), response.done) == (404, b"no", True)
    assert not response.reusable
    long = ResponseReader(max_head=100)
    with pytest.raises(ValueError, match="head over"):
        long.feed(b"HTTP/1.1 200 OK\r\nx: " + b"a" * 200)


def test_what_routerd_writes_parses_in_h11() -> None:
    """Heads and chunks as routerd writes them, read by h11."""
    head = response_head(200, [(b"content-type", b"text/event-stream"),
                               (b"transfer-encoding", b"chunked")])
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(head + chunk(b"data: 1\n\n") + chunk(b"") + chunk(b"data: 2\n\n")
                        + b"0\r\n\r\n")
    response = client.next_event()
    assert isinstance(response, h11.Response) and response.status_code == 200
    assert response.reason == b"OK"
    body = b""
    while not isinstance(event := client.next_event(), h11.EndOfMessage):
        assert isinstance(event, h11.Data)
        body += bytes(event.data)
    assert body == b"data: 1\n\ndata: 2\n\n"
    request = request_head(b"POST", b"/v1/chat/completions",
                           [(b"host", b"up"), (b"content-length", b"2")]) + b"{}"
    server = RequestReader(16384, 100)
    server.feed(request)
    assert server.ready[0].body == b"{}" and _h11_requests(request)[0][3] == b"{}"


@pytest.mark.parametrize(("name", "value"), [
    (b"x-syntrop-provider", b"a\r\nset-cookie: b"), (b"x", b"a\nb"), (b"x:y", b"a"),
])
def test_no_value_splits_a_head(name: bytes, value: bytes) -> None:
    with pytest.raises(ValueError):
        response_head(200, [(name, value)])
    with pytest.raises(ValueError):
        request_head(b"GET", b"/", [(name, value)])
    with pytest.raises(ValueError):
        request_head(b"GET", b"/a b", [])
