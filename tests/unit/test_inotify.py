"""syntrop.system.inotify: the kernel's records unpacked, and the three
calls on a real instance (errors as the OSError subclasses callers catch)."""

import os
import struct
from pathlib import Path

import pytest

from syntrop.system import inotify as ino


def record(wd: int, mask: int, cookie: int, name: bytes, padded: int) -> bytes:
    return struct.pack("iIII", wd, mask, cookie, padded) + name.ljust(padded, b"\0")


def test_records_unpack_with_padded_names_and_none() -> None:
    data = (record(1, ino.CREATE, 0, b"a.service", 16)
            + record(2, ino.DELETE_SELF, 0, b"", 0)
            + record(1, ino.MOVED_TO, 7, "ü.conf".encode(), 32))
    assert ino.parse(data) == [
        ino.RawEvent(1, ino.CREATE, 0, "a.service"),
        ino.RawEvent(2, ino.DELETE_SELF, 0, ""),
        ino.RawEvent(1, ino.MOVED_TO, 7, "ü.conf"),
    ]
    assert ino.parse(data[:10]) == []  # a short tail is not an event


def test_a_real_instance_watches_reads_and_stops(tmp_path: Path) -> None:
    instance = ino.Inotify()
    try:
        assert os.get_blocking(instance.fd) is False
        assert os.get_inheritable(instance.fd) is False
        assert instance.read() == []  # nothing queued: no blocking
        wd = instance.add_watch(str(tmp_path), ino.CREATE | ino.DELETE | ino.ONLYDIR)
        (tmp_path / "x").write_text("1")
        (tmp_path / "x").unlink()
        events = instance.read()
        assert [(e.wd, e.mask, e.name) for e in events] == [
            (wd, ino.CREATE, "x"), (wd, ino.DELETE, "x")]
        with pytest.raises(FileNotFoundError):
            instance.add_watch(str(tmp_path / "missing"), ino.CREATE)
        with pytest.raises(NotADirectoryError):
            (tmp_path / "file").write_text("")
            instance.add_watch(str(tmp_path / "file"), ino.CREATE | ino.ONLYDIR)
        instance.rm_watch(wd)
        instance.rm_watch(wd)  # already gone: ignored
        assert ino.IGNORED in {e.mask for e in instance.read()}
    finally:
        instance.close()
        instance.close()  # twice is harmless
