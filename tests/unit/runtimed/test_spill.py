"""The spill store: memory up to the budget, files beyond, each taken once."""

from pathlib import Path

import pytest

from syntrop.runtimed.engine import Saved
from syntrop.runtimed.spill import SpillStore


def test_memory_then_files_and_back(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", ram_budget=10)
    small = Saved(tokens=[1, 2, -3, 2**31 - 1], data=b"0123456789")
    large = Saved(tokens=list(range(1000)), data=bytes(range(256)) * 4)
    store.put("a", small)
    store.put("b", large)
    assert store.ram_bytes == 10 and len(store) == 2 and "b" in store
    assert store.on_disk("a") is None
    path = store.on_disk("b")
    assert path is not None and path.is_file()
    assert store.take("b") == large and not path.exists()
    assert store.take("a") == small
    assert len(store) == 0
    with pytest.raises(KeyError):
        store.take("a")


def test_drop_and_clear_remove_files(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", ram_budget=0)
    store.put("a", Saved(tokens=[], data=b""))  # an empty state fits a zero budget
    store.put("b", Saved(tokens=[5], data=b"x"))
    store.put("c", Saved(tokens=[6], data=b"y"))
    store.drop("b")
    store.drop("missing")
    assert sorted(p.name for p in (tmp_path / "spill").iterdir()) == ["c.kv"]
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
        store.put(key, saved)
    assert store.ram_bytes == 200 and store.on_disk("a") is None
    assert store.flush() == 200
    assert store.ram_bytes == 0 and len(store) == 2
    assert all(store.on_disk(key) for key in states)
    assert store.flush() == 0
    assert {key: store.take(key) for key in states} == states
