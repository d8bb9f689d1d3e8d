"""Drop-in snapshots, the reverse of contextd's diffs, and undoing history."""

import difflib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syntrop.toold import dropins
from syntrop.toold.dropins import Change


def unified(before: str, after: str, path: str = "/etc/systemd/system/a.service.d/x.conf") -> str:
    """A diff exactly as contextd writes it (shadow.py)."""
    lines = list(difflib.unified_diff(before.splitlines(keepends=True),
                                      after.splitlines(keepends=True),
                                      fromfile=f"a{path}", tofile=f"b{path}", n=3))
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)


texts = st.lists(st.sampled_from(["[Service]", "ExecStart=", "ExecStart=/bin/true", "", "x=1",
                                  "Environment=A=b", "# c"]), max_size=12).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(texts, texts, st.booleans(), st.booleans())
def test_reverse_patch_gives_back_the_old_text(before: str, after: str, nl1: bool,
                                               nl2: bool) -> None:
    before += "\n" if nl1 and before else ""
    after += "\n" if nl2 and after else ""
    diff = unified(before, after)
    if not diff:
        return
    assert dropins.reverse_patch(after, diff) == before


def test_reverse_patch_refuses_a_diff_that_does_not_fit() -> None:
    diff = unified("a\nb\nc\n", "a\nB\nc\n")
    assert dropins.reverse_patch("a\nX\nc\n", diff) is None
    assert dropins.reverse_patch("a\nB\nc\n", diff + "… diff cut at 10 bytes\n") is None


def test_read_dir_refuses_a_symlinked_directory(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "a.service.d").symlink_to(tmp_path / "real")
    with pytest.raises(dropins.UnsafeDirectory, match="symlink"):
        dropins.read_dir(str(tmp_path / "a.service.d"))


def test_read_dir_keeps_content_mode_owner_and_symlinks(tmp_path: Path) -> None:
    directory = tmp_path / "a.service.d"
    directory.mkdir()
    (directory / "10.conf").write_text("[Service]\n")
    os.chmod(directory / "10.conf", 0o640)
    (directory / "20.conf").symlink_to("/dev/null")
    exists, entries = dropins.read_dir(str(directory))
    assert exists
    assert [(e["name"], e["state"]) for e in entries] == [("10.conf", "file"),
                                                          ("20.conf", "symlink")]
    assert entries[0]["mode"] == 0o640 and entries[0]["uid"] == os.getuid()
    assert dropins.text_of(entries[0]) == "[Service]\n"
    assert entries[1]["target"] == "/dev/null"
    assert dropins.read_dir(str(tmp_path / "absent")) == (False, [])


def test_undo_a_created_dropin_removes_it() -> None:
    current = [dropins.file_entry("50-bad.conf", "[Service]\nExecStart=/bin/false\n")]
    events = [Change(name="50-bad.conf", action="created", timestamp_usec=10, diff="x")]
    assert dropins.undo(current, events) == []
    assert dropins.changes(current, []) == [{"name": "50-bad.conf", "state": "absent"}]


def test_undo_takes_back_only_the_newest_burst() -> None:
    old, mid, new = "A=1\n", "A=2\n", "A=3\n"
    current = [dropins.file_entry("x.conf", new)]
    events = [
        Change(name="x.conf", action="modified", timestamp_usec=0, diff=unified(old, mid)),
        Change(name="x.conf", action="modified", timestamp_usec=10_000_000,
               diff=unified(mid, new)),
    ]
    target = dropins.undo(current, events)
    assert target is not None and dropins.text_of(target[0]) == mid


def test_undo_a_deletion_brings_the_file_back() -> None:
    events = [Change(name="x.conf", action="deleted", timestamp_usec=1,
                     diff=unified("[Service]\nNice=5\n", ""))]
    target = dropins.undo([], events)
    assert target is not None and dropins.text_of(target[0]) == "[Service]\nNice=5\n"


def test_undo_gives_up_on_what_it_cannot_undo_exactly() -> None:
    current = [dropins.file_entry("x.conf", "A=9\n")]
    assert dropins.undo(current, [Change(name="x.conf", action="mode", timestamp_usec=1,
                                         diff=None)]) is None
    assert dropins.undo(current, [Change(name="x.conf", action="modified", timestamp_usec=1,
                                         diff=None)]) is None
    assert dropins.undo(current, [Change(name="x.conf", action="modified", timestamp_usec=1,
                                         diff=unified("A=1\n", "A=2\n"))]) is None
    assert dropins.undo(current, []) is None


def test_health_orders_states() -> None:
    assert dropins.health("active") > dropins.health("inactive", "success") \
        > dropins.health("activating") > dropins.health("failed")
