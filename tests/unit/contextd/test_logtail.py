"""Incremental log reading: appends, partial lines, rotation, truncation."""

import os
from pathlib import Path

from syntrop.contextd.logtail import Position, lines_complete, read_new
from syntrop.contextd.packages import apt_complete


def read(path: Path, position: Position | None) -> tuple[bytes, Position | None]:
    chunks, new = read_new(str(path), position, lines_complete)
    return b"".join(chunks), new


def test_appends_are_read_once_and_partial_lines_wait(tmp_path: Path) -> None:
    log = tmp_path / "dpkg.log"
    log.write_bytes(b"one\ntw")
    data, position = read(log, None)
    assert data == b"one\n" and position is not None and position.offset == 4
    data, position = read(log, position)
    assert data == b""
    with log.open("ab") as file:
        file.write(b"o\nthree\n")
    data, position = read(log, position)
    assert data == b"two\nthree\n"
    assert read(log, position)[0] == b""


def test_rotation_finishes_the_old_file_then_reads_the_new(tmp_path: Path) -> None:
    log = tmp_path / "dpkg.log"
    log.write_bytes(b"a\n")
    _, position = read(log, None)
    with log.open("ab") as file:
        file.write(b"b\n")  # written after our read, before rotation
    os.rename(log, tmp_path / "dpkg.log.1")
    log.write_bytes(b"c\n")
    data, position = read(log, position)
    assert data == b"b\nc\n"
    assert position is not None and position.inode == os.stat(log).st_ino


def test_dateext_rotation_and_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "history.log"
    log.write_bytes(b"a\n")
    _, position = read(log, None)
    with log.open("ab") as file:
        file.write(b"b\n")
    os.rename(log, tmp_path / "history.log-20240115")
    data, position = read(log, position)
    assert data == b"b\n" and position is None  # no new file yet
    log.write_bytes(b"c\n")
    assert read(log, position)[0] == b"c\n"


def test_copytruncate_and_rewrite_start_over(tmp_path: Path) -> None:
    log = tmp_path / "dpkg.log"
    log.write_bytes(b"first line\nsecond\n")
    _, position = read(log, None)
    with log.open("r+b") as file:
        file.truncate(0)
    log.write_bytes(b"x\n")  # same inode, shorter
    data, position = read(log, position)
    assert data == b"x\n"
    log.write_bytes(b"y\nrewritten from the start, longer than before\n")
    data, _ = read(log, position)
    assert data.startswith(b"y\n")


def test_apt_reads_whole_stanzas(tmp_path: Path) -> None:
    log = tmp_path / "history.log"
    log.write_bytes(b"\nStart-Date: x\nInstall: a:amd64 (1)\n")
    chunks, position = read_new(str(log), None, apt_complete)
    assert chunks == [] and position is not None and position.offset == 0
    with log.open("ab") as file:
        file.write(b"End-Date: y\n\nStart-Date: z\n")
    chunks, position = read_new(str(log), position, apt_complete)
    assert chunks == [b"\nStart-Date: x\nInstall: a:amd64 (1)\nEnd-Date: y\n"]
