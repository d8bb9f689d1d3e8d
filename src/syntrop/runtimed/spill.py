"""Spilled session state: the KV cache of idle sessions, parked in host
memory up to a byte budget and in files beyond it, so their slots can serve
others and the sessions come back warm.

A session's context lives in its model's engine worker; spilling it there
writes the state into a memfd (worker/saved.py) that the worker hands to
runtimed, which keeps it here: the memfd itself while the budget allows,
else a file under the state directory it is copied into. Restoring hands
the descriptor back to a worker, which reads it.

Blocking (copies): the service calls `put`, `take` and `flush` in threads.
"""

import os
import threading
from dataclasses import dataclass
from pathlib import Path

#: Bytes copied per call when a memfd moves to a file.
CHUNK = 1 << 22


@dataclass(slots=True)
class _Held:
    fd: int | None  # the memfd, while in memory
    size: int
    path: Path | None = None


class SpillStore:
    def __init__(self, directory: Path, ram_budget: int) -> None:
        self.directory = directory
        self.ram_budget = ram_budget
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        # Files left by an earlier process belong to sessions that ended with it.
        for stale in directory.glob("*.kv") if directory.is_dir() else ():
            stale.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: str) -> bool:
        return key in self._held

    @property
    def ram_bytes(self) -> int:
        return sum(h.size for h in self._held.values() if h.fd is not None)

    def on_disk(self, key: str) -> Path | None:
        held = self._held.get(key)
        return held.path if held is not None else None

    def put(self, key: str, fd: int) -> None:
        """Keep the state behind `fd` (a memfd; the store owns it from now
        on) under `key`: in memory if the budget allows, else in a file."""
        size = os.fstat(fd).st_size
        with self._lock:
            self._drop_locked(key)
            if self.ram_bytes + size <= self.ram_budget:
                self._held[key] = _Held(fd, size)
                return
        try:
            path = self._write(key, fd, size)
        finally:
            os.close(fd)
        with self._lock:
            self._held[key] = _Held(None, size, path)

    def flush(self) -> int:
        """Move every state held in memory to its file (memory pressure);
        the bytes moved."""
        with self._lock:
            in_memory = {k: h for k, h in self._held.items() if h.fd is not None}
        moved = 0
        for key, held in in_memory.items():
            assert held.fd is not None
            path = self._write(key, held.fd, held.size)
            with self._lock:
                if self._held.get(key) is held:
                    os.close(held.fd)
                    held.fd, held.path = None, path
                    moved += held.size
                else:  # taken or dropped meanwhile
                    path.unlink(missing_ok=True)
        return moved

    def _write(self, key: str, fd: int, size: int) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.directory / f"{key}.kv"
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            offset = 0
            while offset < size:  # memfd (tmpfs) to the state directory's filesystem
                copied = os.sendfile(out, fd, offset, min(CHUNK, size - offset))
                if copied == 0:
                    break
                offset += copied
        finally:
            os.close(out)
        return path

    def take(self, key: str) -> int:
        """A descriptor of the state under `key`, removed from the store
        (KeyError if none); the caller closes it."""
        with self._lock:
            held = self._held.pop(key)
        if held.fd is not None:
            return held.fd
        assert held.path is not None
        try:
            return os.open(held.path, os.O_RDONLY | os.O_CLOEXEC)
        finally:
            held.path.unlink(missing_ok=True)

    def drop(self, key: str) -> None:
        with self._lock:
            self._drop_locked(key)

    def _drop_locked(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is None:
            return
        if held.fd is not None:
            os.close(held.fd)
        if held.path is not None:
            held.path.unlink(missing_ok=True)

    def clear(self) -> None:
        for key in list(self._held):
            self.drop(key)

