"""Snapshots and diffs: text, binary, large, symlinks, special files, modes."""

import os
from pathlib import Path

from syntrop.contextd.shadow import FileState, compare, snapshot

LIMIT = 1024


def snap(path: Path, *, keep: bool = True) -> FileState | None:
    return snapshot(str(path), max_file_bytes=LIMIT, budget=LIMIT if keep else 1)


def test_text_file_modified_gives_a_unified_diff(tmp_path: Path) -> None:
    path = tmp_path / "foo.service"
    path.write_text("[Service]\nExecStart=/bin/true\nUser=a\n")
    before = snap(path)
    path.write_text("[Service]\nExecStart=/bin/false\nUser=a\n")
    change = compare(str(path), before, snap(path), max_diff_bytes=4096)
    assert change is not None and change.action == "modified"
    assert change.diff is not None
    assert f"--- a{path}\n+++ b{path}\n" in change.diff
    assert "-ExecStart=/bin/true\n+ExecStart=/bin/false\n" in change.diff
    assert change.detail == "+1 -1 lines: +ExecStart=/bin/false"


def test_created_and_deleted(tmp_path: Path) -> None:
    path = tmp_path / "x.conf"
    path.write_text("[Unit]\nAfter=a\n")
    created = compare(str(path), None, snap(path), max_diff_bytes=4096)
    assert created is not None and created.action == "created"
    assert created.diff is not None and created.diff.startswith("--- /dev/null\n")
    state = snap(path)
    assert state is not None
    path.unlink()
    assert snap(path) is None
    deleted = compare(str(path), state, None, max_diff_bytes=4096)
    assert deleted is not None and deleted.action == "deleted"
    assert deleted.diff is not None and "+++ /dev/null" in deleted.diff
    assert deleted.mode == state.mode


def test_unchanged_content_and_touch_are_no_change(tmp_path: Path) -> None:
    path = tmp_path / "a.service"
    path.write_text("x\n")
    before = snap(path)
    os.utime(path, (1, 1))
    assert compare(str(path), before, snap(path), max_diff_bytes=4096) is None


def test_mode_change_alone(tmp_path: Path) -> None:
    path = tmp_path / "a.service"
    path.write_text("x\n")
    path.chmod(0o644)
    before = snap(path)
    path.chmod(0o600)
    change = compare(str(path), before, snap(path), max_diff_bytes=4096)
    assert change is not None and (change.action, change.mode, change.diff) == ("mode", 0o600, None)
    assert change.detail == "mode 0644 → 0600"


def test_binary_file_has_no_diff_body(tmp_path: Path) -> None:
    path = tmp_path / "blob.service"
    path.write_bytes(b"\x7fELF\x00\x01\x02")
    state = snap(path)
    assert state is not None and state.binary and state.content is None
    change = compare(str(path), None, state, max_diff_bytes=4096)
    assert change is not None and change.diff is None and change.detail == "binary, 7 bytes"
    path.write_bytes(b"\xff\xfe not utf-8")
    change = compare(str(path), state, snap(path), max_diff_bytes=4096)
    assert change is not None and change.action == "modified" and change.diff is None


def test_large_file_is_hashed_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "big.conf"
    path.write_text("a\n" * LIMIT)
    state = snap(path)
    assert state is not None and state.content is None and state.size == 2 * LIMIT
    path.write_text("b\n" * LIMIT)
    change = compare(str(path), state, snap(path), max_diff_bytes=4096)
    assert change is not None and change.diff is None
    assert change.detail == f"{2 * LIMIT} bytes, too large to diff"


def test_budget_exhausted_keeps_digest_only(tmp_path: Path) -> None:
    path = tmp_path / "a.conf"
    path.write_text("x\n")
    state = snap(path, keep=False)
    assert state is not None and state.content is None and not state.binary


def test_long_diff_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "a.conf"
    path.write_text("".join(f"line {i}\n" for i in 100 * [0]))
    before = snap(path)
    path.write_text("".join(f"other {i}\n" for i in range(100)))
    change = compare(str(path), before, snap(path), max_diff_bytes=300)
    assert change is not None and change.diff is not None
    assert len(change.diff.encode()) <= 300 + 40
    assert change.diff.endswith("… diff cut at 300 bytes\n")


def test_symlink_target_change(tmp_path: Path) -> None:
    link = tmp_path / "foo.service"
    link.symlink_to("/lib/systemd/system/foo.service")
    before = snap(link)
    assert before is not None and before.kind == "symlink"
    link.unlink()
    link.symlink_to("/dev/null")  # masked
    change = compare(str(link), before, snap(link), max_diff_bytes=4096)
    assert change is not None and change.diff is not None
    assert "--> /lib/systemd/system/foo.service\n+-> /dev/null\n" in change.diff


def test_fifo_is_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "trap.service"
    os.mkfifo(fifo)
    state = snap(fifo)  # would block forever if opened for reading
    assert state is not None and state.kind == "other"
    change = compare(str(fifo), None, state, max_diff_bytes=4096)
    assert change is not None and change.detail == "not a regular file"


def test_unreadable_is_recorded_without_content(tmp_path: Path) -> None:
    directory = tmp_path / "closed"
    directory.mkdir()
    path = directory / "a.conf"
    path.write_text("x")
    # A path through a regular file fails with ENOTDIR: absent, not an error;
    # a name too long fails with ENAMETOOLONG: unreadable.
    assert snapshot(str(path / "below"), max_file_bytes=LIMIT, budget=LIMIT) is None
    state = snapshot(str(tmp_path / ("x" * 300)), max_file_bytes=LIMIT, budget=LIMIT)
    assert state is not None and state.kind == "unreadable" and state.error
    change = compare("p", None, state, max_diff_bytes=4096)
    assert change is not None and change.diff is None and change.detail.startswith("unreadable")
