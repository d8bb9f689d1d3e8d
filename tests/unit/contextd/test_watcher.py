"""The watcher with real inotify on temporary directories: what each kind of
change becomes."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from syntrop.contextd.watcher import Notice, Watcher
from syntrop.system.inotify import Inotify


@pytest.fixture
def inotify() -> Iterator[Inotify]:
    instance = Inotify()
    yield instance
    instance.close()


def drain(watcher: Watcher) -> Notice:
    return watcher.handle(watcher.inotify.read())


def test_writes_renames_deletes_and_ignored_names(tmp_path: Path, inotify: Inotify) -> None:
    root = tmp_path / "system"
    root.mkdir()
    watcher = Watcher(inotify, [str(root)], max_watches=16)
    assert watcher.start() == {str(root)}
    (root / "a.service").write_text("x")
    (root / "a.service~").write_text("backup")  # ignored, as systemd does
    (root / ".tmp123").write_text("y")
    os.rename(root / ".tmp123", root / "b.service")  # an editor's atomic replace
    notice = drain(watcher)
    assert notice.now == {str(root / "a.service"), str(root / "b.service")}
    assert (str(root / ".tmp123"), str(root / "b.service")) in notice.moves
    (root / "a.service").unlink()
    assert drain(watcher).now == {str(root / "a.service")}


def test_open_writer_waits_until_closed(tmp_path: Path, inotify: Inotify) -> None:
    root = tmp_path / "system"
    root.mkdir()
    watcher = Watcher(inotify, [str(root)], max_watches=16)
    watcher.start()
    with (root / "slow.service").open("w") as file:
        file.write("[Unit]\n")
        file.flush()
        notice = drain(watcher)
        assert notice.later == {str(root / "slow.service")} and not notice.now
    assert drain(watcher).now == {str(root / "slow.service")}


def test_dropin_directory_appearing_later(tmp_path: Path, inotify: Inotify) -> None:
    root = tmp_path / "system"
    root.mkdir()
    watcher = Watcher(inotify, [str(root)], max_watches=16)
    watcher.start()
    (root / "a.service.d").mkdir()
    (root / "not-watched").mkdir()
    notice = drain(watcher)
    assert notice.scan == {str(root / "a.service.d")}
    assert str(root / "a.service.d") in watcher.dirs
    assert str(root / "not-watched") not in watcher.dirs
    (root / "a.service.d" / "x.conf").write_text("[Service]\n")
    (root / "a.service.d" / "x.txt").write_text("ignored")
    assert drain(watcher).now == {str(root / "a.service.d" / "x.conf")}
    os.rename(root / "a.service.d", tmp_path / "elsewhere")
    notice = drain(watcher)
    assert notice.gone == {str(root / "a.service.d")}
    assert str(root / "a.service.d") not in watcher.dirs


def test_missing_root_is_waited_for(tmp_path: Path, inotify: Inotify) -> None:
    root = tmp_path / "run" / "systemd" / "system"
    watcher = Watcher(inotify, [str(root)], max_watches=16)
    assert watcher.start() == set()
    assert str(tmp_path) in watcher.dirs
    (tmp_path / "run").mkdir()
    drain(watcher)
    root.mkdir(parents=True)
    notice = drain(watcher)
    notice.scan |= drain(watcher).scan
    assert str(root) in watcher.active
    assert str(root) in notice.scan


def test_references_are_filtered_by_name(tmp_path: Path, inotify: Inotify) -> None:
    root = tmp_path / "system"
    root.mkdir()
    etc = tmp_path / "default"
    etc.mkdir()
    watcher = Watcher(inotify, [str(root)], max_watches=16)
    watcher.start()
    fresh = watcher.set_references([str(etc / "web")])
    assert fresh == {str(etc / "web")}
    (etc / "web").write_text("A=1\n")
    (etc / "other").write_text("B=1\n")
    assert drain(watcher).now == {str(etc / "web")}
    watcher.set_references([])
    assert str(etc) not in watcher.dirs


def test_watch_limit_is_counted(tmp_path: Path, inotify: Inotify) -> None:
    root = tmp_path / "system"
    root.mkdir()
    watcher = Watcher(inotify, [str(root)], max_watches=2)
    watcher.start()
    for name in ("a.service.d", "b.service.d", "c.service.d"):
        (root / name).mkdir()
    drain(watcher)
    assert len(watcher.dirs) == 2 and watcher.refused == 2
