"""A worker's pools of idle contexts (no llama.cpp: contexts are stand-ins
that record being closed)."""

import os

from syntrop.runtimed.engine import Options
from syntrop.runtimed.host import Pool


class Context:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_trim_closes_the_idle_contexts_only() -> None:
    pool = Pool(name="m", fd=os.open("/dev/null", os.O_RDONLY))
    small, large = Options(n_ctx=64), Options(n_ctx=4096)
    idle = [Context(), Context(), Context()]
    pool.give(small, idle[0])  # type: ignore[arg-type]
    pool.give(small, idle[1])  # type: ignore[arg-type]
    pool.give(large, idle[2])  # type: ignore[arg-type]
    in_use = pool.take_idle(small)
    assert pool.trim() == 2
    assert in_use is idle[1] and not idle[1].closed  # type: ignore[comparison-overlap]
    assert idle[0].closed and idle[2].closed
    assert pool.take_idle(small) is None and pool.trim() == 0
    pool.close()
