"""Resident models' pools of idle contexts (no llama.cpp: contexts are
stand-ins that record being closed)."""

from syntrop.runtimed.engine import Options
from syntrop.runtimed.models import Resident


class Context:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_trim_closes_the_idle_contexts_only() -> None:
    resident = Resident(name="m", fd=-1, digest="0" * 64, size=1)
    small, large = Options(n_ctx=64), Options(n_ctx=4096)
    idle = [Context(), Context(), Context()]
    resident.give(small, idle[0])  # type: ignore[arg-type]
    resident.give(small, idle[1])  # type: ignore[arg-type]
    resident.give(large, idle[2])  # type: ignore[arg-type]
    in_use = resident.take_idle(small)
    assert resident.trim() == 2
    assert in_use is idle[1] and not idle[1].closed  # type: ignore[comparison-overlap]
    assert idle[0].closed and idle[2].closed
    assert resident.take_idle(small) is None and resident.trim() == 0
