"""The slot layout: how concurrent generations share the CPUs.

Every slot is a llama.cpp context of its own (the weights are mmapped once,
so another context costs only its KV cache). What differs between layouts is
how many threads each context decodes with while others run:

- ``threads``: one context computes at a time, with all threads; concurrent
  streams take turns token by token (a gate of one).
- ``instances``: ``instances`` contexts compute side by side with
  ``cpus // instances`` threads each (default: one per CPU, one thread each).
- ``auto``: adaptive: a context uses ``cpus // active`` threads (at least
  one), where ``active`` is the number of generations running now; a lone
  stream decodes with every thread, four streams on two CPUs with one each.
- ``batch``: completion and chat streams share one decode batch per model
  (batch.py's continuous batching, every thread); sessions' contexts pace
  as in ``auto``.

Each model's engine runs in a worker process of its own (worker/loop.py), so
the count of running generations and the ``threads`` layout's gate span
processes: a `Board` is one shared page (a memfd runtimed makes and hands
to every worker) with a cell per worker, each written only by its worker,
summed by all; the gate is a POSIX record lock on the same memfd, which
excludes other processes (threads of one worker queue on a lock of their
own first).

Why ``auto`` is the default (figures in docs/runtimed.md): on a 2-core host
one stream decodes fastest with 2 threads (on a quiet host), but contexts
of 1 thread each side by side give 1.6-2.7x the aggregate of one 2-thread
context serving in turn, and more than 2-thread contexts side by side (whose
threads spin at barriers on oversubscribed cores). Changing a context's thread count is one call
(``llama_set_n_threads``, a few microseconds), so the layout follows the load
token by token instead of being fixed at start.
"""

import contextlib
import fcntl
import mmap
import os
import threading
from collections.abc import Iterator

LAYOUTS = ("auto", "instances", "threads", "batch")
#: Workers a Board has room for (one int32 cell each).
CELLS = 256


class Board:
    """Running generations of every engine worker, in a shared memfd: one
    int32 cell per worker, written only by that worker (aligned 4-byte
    stores: never torn), read by all."""

    def __init__(self, fd: int, cell: int) -> None:
        if not 0 <= cell < CELLS:
            raise ValueError(f"cell: 0 to {CELLS - 1}")
        self.fd = fd
        self.cell = cell
        self._map = mmap.mmap(fd, CELLS * 4)
        self._cells = memoryview(self._map).cast("i")

    @staticmethod
    def create() -> int:
        """A new board's memfd (runtimed keeps it; workers inherit it)."""
        fd = os.memfd_create("syntrop-pace", os.MFD_CLOEXEC)
        os.ftruncate(fd, CELLS * 4)
        return fd

    @staticmethod
    def clear(fd: int, cell: int) -> None:
        """Zero a dead worker's cell (runtimed, before reusing it)."""
        os.pwrite(fd, b"\0\0\0\0", cell * 4)

    def set(self, count: int) -> None:
        self._cells[self.cell] = count

    def total(self) -> int:
        return sum(self._cells)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The gate across workers (a record lock on the board)."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)


class Pace:
    """Thread counts and turns for concurrent generations. Thread-safe."""

    def __init__(self, layout: str = "auto", cpus: int = 0, instances: int = 0,
                 board: Board | None = None) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout: one of {', '.join(LAYOUTS)}")
        if cpus < 0 or instances < 0:
            raise ValueError("cpus and instances: 0 (all, one per CPU) or more")
        self.layout = layout
        self.cpus = cpus or (os.cpu_count() or 1)
        self.instances = instances or self.cpus
        self._lock = threading.Lock()
        self._active = 0
        self._gate = threading.Semaphore(1) if layout == "threads" else None
        self._board = board

    @property
    def active(self) -> int:
        """Generations running now: in every worker, given a board."""
        return self._board.total() if self._board is not None else self._active

    def threads(self, limit: int = 0) -> int:
        """Threads a context should use now; `limit` caps it (0: the CPUs)."""
        cap = min(limit or self.cpus, self.cpus)
        if self.layout == "threads":
            return cap
        if self.layout == "instances":
            return max(1, min(cap, self.cpus // self.instances))
        return max(1, min(cap, self.cpus // max(1, self.active)))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Count a generation as active while the block runs."""
        with self._lock:
            self._active += 1
            if self._board is not None:
                self._board.set(self._active)
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._board is not None:
                    self._board.set(self._active)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """One step of computation (a token, a prefill); waits for the gate
        in the ``threads`` layout."""
        if self._gate is None:
            yield
            return
        with self._gate, (self._board.exclusive() if self._board is not None
                          else contextlib.nullcontext()):
            yield
