"""routerctl route --messages: a chat request's JSON or a list of messages;
anything else is a one-line message and exit status, never a traceback."""

from pathlib import Path

import pytest

from syntrop.cli.routerctl import _messages


def test_a_request_or_a_list_of_messages_is_read(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text('{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    listed = tmp_path / "list.json"
    listed.write_text('[{"role": "system", "content": "rules"}]')
    assert [(m.role, m.content) for m in _messages(str(request))] == [("user", "hi")]
    assert [(m.role, m.content) for m in _messages(str(listed))] == [("system", "rules")]


@pytest.mark.parametrize("text", ["not json", '{"model": "m"}', "[1, 2]", '[{"role": "u"}]'])
def test_anything_else_is_a_clear_message(tmp_path: Path, text: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(SystemExit) as refused:
        _messages(str(bad))
    assert str(refused.value).startswith(f"routerctl: {bad}: not a chat request")


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        _messages(str(tmp_path / "absent.json"))
    assert "No such file" in str(refused.value)
