"""sd_notify against a real datagram socket."""

import socket
from pathlib import Path

import pytest

from syntrop.system.notify import notify, watchdog_interval


def test_notify_sends_assignments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert notify("READY=1", "STATUS=Serving")
        assert receiver.recv(4096) == b"READY=1\nSTATUS=Serving"


def test_notify_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"syntrop-test-{id(monkeypatch)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("WATCHDOG=1")
        assert receiver.recv(64) == b"WATCHDOG=1"


def test_notify_without_manager_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not notify("READY=1")


def test_notify_to_missing_socket_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert not notify("READY=1")


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [("10000000", None, 5.0), ("0", None, None), ("junk", None, None), ("2000000", "1", None)],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str, pid: str | None, expected: float | None
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is None:
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
    else:
        monkeypatch.setenv("WATCHDOG_PID", pid)
    assert watchdog_interval() == expected
