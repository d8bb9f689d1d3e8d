"""Resident models: the verified descriptor from modeld and a pool of idle
engine contexts on it.

The descriptor stays open while the model is resident (modeld treats it as
"in use"). Stateless requests (Complete, Chat, Embed) borrow an idle context
or load a new one; sessions load their own and close it on Close.

Keep-alive: every request and open session holds the model (`hold` /
`release`); once nothing holds it, `idle_for` counts the seconds since the
last release, and the service unloads it past its keep-alive.
"""

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syntrop.runtimed.engine import Engine, Options, verify


class WeightsDiffer(Exception):
    """The bytes behind the descriptor do not hash to the pinned digest."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


def _bare(digest: str) -> str:
    return digest.removeprefix("sha256:").lower()


async def open_in_modeld(socket: Path, name: str, timeout: float) -> tuple[int, str, int]:
    """A model's descriptor from modeld (Model1.OpenModel over `socket`),
    duplicated for the caller to keep and close, with the digest (bare hex)
    and size modeld reports. Raises modeld's ModelNotFound or
    InvalidIdentifier, or OSError when modeld cannot be reached."""
    from syntrop.interfaces.model import Model1
    from syntrop.varlink.client import connect

    async with await connect(Model1, address=socket, timeout=timeout) as modeld:
        with await modeld.OpenModel(name=name) as reply:
            return os.dup(reply["fd"].fileno()), _bare(str(reply["digest"])), int(reply["size"])


@dataclass(slots=True, kw_only=True)
class Resident:
    """One model made resident from a descriptor modeld handed over."""

    name: str
    fd: int
    digest: str
    size: int
    idle: dict[Options, list[Engine]] = field(default_factory=dict)
    busy: int = 0
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Layout batch: the model's shared decode batch (batch.Batcher) and the
    #: small context that tokenizes for it.
    batcher: Any = None
    batch_engine: Engine | None = None
    #: SHA-256 over the vocabulary (speculative.vocabulary_digest), once.
    vocabulary: str | None = None

    @classmethod
    def open(cls, name: str, fd: int, digest: str, size: int) -> "Resident":
        """Take ownership of `fd` after checking its bytes against `digest`
        (blocking: hashes the whole file). Closes `fd` on failure."""
        try:
            actual = verify(fd)
            if actual != _bare(digest):
                raise WeightsDiffer(_bare(digest), actual)
            # Load once to refuse a non-GGUF or truncated blob now.
            probe = Engine.load(fd, Options(n_ctx=64, n_batch=64, n_threads=1))
        except BaseException:
            os.close(fd)
            raise
        resident = cls(name=name, fd=fd, digest=_bare(digest), size=size)
        probe.close()
        return resident

    def hold(self) -> None:
        """A request or session uses the model: no unloading meanwhile."""
        with self.lock:
            self.busy += 1

    def release(self) -> None:
        with self.lock:
            self.busy -= 1
            self.last_used = time.monotonic()

    def idle_for(self, now: float) -> float | None:
        """Seconds since the last release; None while something holds it."""
        with self.lock:
            return None if self.busy else max(0.0, now - self.last_used)

    def take_idle(self, options: Options) -> Engine | None:
        """An idle context with these options, if there is one (no blocking)."""
        with self.lock:
            pool = self.idle.get(options)
            return pool.pop() if pool else None

    def take(self, options: Options) -> Engine:
        """An idle context with these options, or a newly loaded one (blocking)."""
        return self.take_idle(options) or Engine.load(self.fd, options)

    def give(self, options: Options, engine: Engine) -> None:
        with self.lock:
            self.idle.setdefault(options, []).append(engine)

    def trim(self) -> int:
        """Close the idle contexts kept for later requests; how many."""
        with self.lock:
            pools, self.idle = self.idle, {}
        engines = [engine for pool in pools.values() for engine in pool]
        for engine in engines:
            engine.close()
        return len(engines)

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None
        if self.batch_engine is not None:
            self.batch_engine.close()
            self.batch_engine = None
        for pool in self.idle.values():
            for engine in pool:
                engine.close()
        self.idle.clear()
        os.close(self.fd)
