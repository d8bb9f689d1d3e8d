from syntrop.routerd.sse import SSEParser, event


def test_events_split_across_chunks() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: {\"a\"") == []
    assert parser.feed(b": 1}\n") == []
    assert parser.feed(b"\ndata: [DONE]\n\n") == ['{"a": 1}', "[DONE]"]


def test_crlf_comments_and_multiline_data() -> None:
    parser = SSEParser()
    got = parser.feed(b": keep-alive\r\n\r\nevent: x\r\ndata:one\r\ndata: two\r\n\r\n")
    assert got == ["one\ntwo"]


def test_oversized_event_is_refused() -> None:
    parser = SSEParser(limit=10)
    try:
        parser.feed(b"data: " + b"x" * 20)
    except ValueError:
        return
    raise AssertionError("no ValueError")


def test_event_round_trips() -> None:
    assert SSEParser().feed(event('{"x": 1}')) == ['{"x": 1}']
