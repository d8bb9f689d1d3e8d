"""The spill store: states arrive as memfds from the engine workers, stay in
memory up to the budget and go to files beyond it, and each is taken once,
byte for byte what the worker wrote."""

import os
from pathlib import Path

import pytest

from syntrop.runtimed.spill import SpillStore
from syntrop.runtimed.worker.engine import Saved
from syntrop.runtimed.worker.saved import read_saved, write_saved


def memfd(saved: Saved) -> int:
    """What a worker hands over when it spills a session."""
    fd = os.memfd_create("test-spill")
    write_saved(fd, saved)
    return fd


def taken(store: SpillStore, key: str) -> Saved:
    fd = store.take(key)
    try:
        return read_saved(fd)
    finally:
        os.close(fd)


def test_memory_then_files_and_back(tmp_path: Path) -> None:
    small = Saved(tokens=[1, 2, -3, 2**31 - 1], data=b"0123456789")
    large = Saved(tokens=list(range(1000)), data=bytes(range(256)) * 4)
    store = SpillStore(tmp_path / "spill", ram_budget=8 + 4 * 4 + 10)
    store.put("a", memfd(small))
    store.put("b", memfd(large))
    assert store.ram_bytes == 34 and len(store) == 2 and "b" in store
    assert store.on_disk("a") is None
    path = store.on_disk("b")
    assert path is not None and path.is_file()
    assert taken(store, "b") == large and not path.exists()
    assert taken(store, "a") == small
    assert len(store) == 0
    with pytest.raises(KeyError):
        store.take("a")


def test_drop_and_clear_remove_files(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", ram_budget=0)
    for key, saved in (("a", Saved(tokens=[], data=b"")), ("b", Saved(tokens=[5], data=b"x")),
                       ("c", Saved(tokens=[6], data=b"y"))):
        store.put(key, memfd(saved))
    store.drop("b")
    store.drop("missing")
    assert sorted(p.name for p in (tmp_path / "spill").iterdir()) == ["a.kv", "c.kv"]
    store.clear()
    assert len(store) == 0 and not list((tmp_path / "spill").iterdir())


def test_files_of_an_earlier_process_are_removed(tmp_path: Path) -> None:
    (tmp_path / "spill").mkdir()
    (tmp_path / "spill" / "old.kv").write_bytes(b"x")
    (tmp_path / "spill" / "notes.txt").write_text("kept")
    store = SpillStore(tmp_path / "spill", ram_budget=0)
    assert len(store) == 0
    assert [p.name for p in (tmp_path / "spill").iterdir()] == ["notes.txt"]


def test_flush_moves_memory_to_files(tmp_path: Path) -> None:
    """Memory pressure: every state held in memory goes to its file, and
    comes back the same."""
    store = SpillStore(tmp_path / "spill", ram_budget=1 << 20)
    states = {key: Saved(tokens=[i, i + 1], data=bytes([i]) * 100)
              for i, key in enumerate(("a", "b"))}
    for key, saved in states.items():
        store.put(key, memfd(saved))
    assert store.ram_bytes == 2 * (8 + 8 + 100) and store.on_disk("a") is None
    assert store.flush() == 2 * 116
    assert store.ram_bytes == 0 and len(store) == 2
    assert all(store.on_disk(key) for key in states)
    assert store.flush() == 0
    assert {key: taken(store, key) for key in states} == states


def test_a_damaged_state_is_refused(tmp_path: Path) -> None:
    fd = os.memfd_create("test-spill")
    try:
        os.write(fd, (1000).to_bytes(8, "little") + b"\0" * 12)  # 1000 tokens promised, 3 there
        with pytest.raises(ValueError, match="truncated"):
            read_saved(fd)
    finally:
        os.close(fd)
