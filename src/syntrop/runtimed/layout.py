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

Why ``auto`` is the default (figures in docs/runtimed.md): on a 2-core host
one stream decodes fastest with 2 threads (on a quiet host), but contexts
of 1 thread each side by side give 1.6-2.7x the aggregate of one 2-thread
context serving in turn, and more than 2-thread contexts side by side (whose
threads spin at barriers on oversubscribed cores). Changing a context's thread count is one call
(``llama_set_n_threads``, a few microseconds), so the layout follows the load
token by token instead of being fixed at start.
"""

import contextlib
import os
import threading
from collections.abc import Iterator

LAYOUTS = ("auto", "instances", "threads", "batch")


class Pace:
    """Thread counts and turns for concurrent generations. Thread-safe."""

    def __init__(self, layout: str = "auto", cpus: int = 0, instances: int = 0) -> None:
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

    @property
    def active(self) -> int:
        return self._active

    def threads(self, limit: int = 0) -> int:
        """Threads a context should use now; `limit` caps it (0: the CPUs)."""
        cap = min(limit or self.cpus, self.cpus)
        if self.layout == "threads":
            return cap
        if self.layout == "instances":
            return max(1, min(cap, self.cpus // self.instances))
        return max(1, min(cap, self.cpus // max(1, self._active)))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Count a generation as active while the block runs."""
        with self._lock:
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """One step of computation (a token, a prefill); waits for the gate
        in the ``threads`` layout."""
        if self._gate is None:
            yield
            return
        with self._gate:
            yield
