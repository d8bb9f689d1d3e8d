"""Spilled session state: the KV cache of idle sessions, parked in host
memory up to a byte budget and in files beyond it, so their slots can serve
others and the sessions come back warm.

Blocking (files): the service calls `put` and `take` in worker threads. File
format: the token count (8 bytes, little-endian), the tokens (4 bytes each),
then llama.cpp's sequence state.
"""

import sys
import threading
from array import array
from pathlib import Path

from syntrop.runtimed.engine import Saved


class SpillStore:
    def __init__(self, directory: Path, ram_budget: int) -> None:
        self.directory = directory
        self.ram_budget = ram_budget
        self._ram: dict[str, Saved] = {}
        self._files: dict[str, Path] = {}
        self._lock = threading.Lock()
        # Files left by an earlier process belong to sessions that ended with it.
        for stale in directory.glob("*.kv") if directory.is_dir() else ():
            stale.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._ram) + len(self._files)

    def __contains__(self, key: str) -> bool:
        return key in self._ram or key in self._files

    @property
    def ram_bytes(self) -> int:
        return sum(len(s.data) for s in self._ram.values())

    def on_disk(self, key: str) -> Path | None:
        return self._files.get(key)

    def put(self, key: str, saved: Saved) -> None:
        """Keep `saved` under `key`: in memory if the budget allows, else in a file."""
        with self._lock:
            if self.ram_bytes + len(saved.data) <= self.ram_budget:
                self._ram[key] = saved
                return
        self._write(key, saved)

    def flush(self) -> int:
        """Move every state held in memory to its file (memory pressure);
        the bytes moved."""
        with self._lock:
            held, self._ram = self._ram, {}
        for key, saved in held.items():
            self._write(key, saved)
        return sum(len(saved.data) for saved in held.values())

    def _write(self, key: str, saved: Saved) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.directory / f"{key}.kv"
        tokens = _little(array("i", saved.tokens))
        with path.open("wb") as file:
            file.write(len(saved.tokens).to_bytes(8, "little"))
            file.write(tokens.tobytes())
            file.write(saved.data)
        with self._lock:
            self._files[key] = path

    def take(self, key: str) -> Saved:
        """The state under `key`, removed from the store (KeyError if none)."""
        with self._lock:
            saved = self._ram.pop(key, None)
            path = None if saved is not None else self._files.pop(key)
        if saved is not None:
            return saved
        assert path is not None
        try:
            blob = path.read_bytes()
        finally:
            path.unlink(missing_ok=True)
        count = int.from_bytes(blob[:8], "little")
        tokens = array("i")
        tokens.frombytes(blob[8:8 + 4 * count])
        return Saved(tokens=_little(tokens).tolist(), data=blob[8 + 4 * count:])

    def drop(self, key: str) -> None:
        with self._lock:
            self._ram.pop(key, None)
            path = self._files.pop(key, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def clear(self) -> None:
        for key in list(self._ram) + list(self._files):
            self.drop(key)


def _little(tokens: "array[int]") -> "array[int]":
    """`tokens` in little-endian order (swapped in place on a big-endian host)."""
    if tokens.itemsize != 4:
        raise RuntimeError("C int is not 4 bytes here")
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens
