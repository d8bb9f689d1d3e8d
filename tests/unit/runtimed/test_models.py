"""A worker's pools of idle contexts (no llama.cpp: contexts are stand-ins
that record being closed and the tokens they hold)."""

import os
from collections.abc import Iterator

import pytest

from syntrop.prefix import reported
from syntrop.runtimed.protocol import Options
from syntrop.runtimed.worker.engine import Engine, Weights
from syntrop.runtimed.worker.pool import REUSE_MIN, Pool


class Context:
    def __init__(self, tokens: list[int] | None = None) -> None:
        self.closed = False
        self.tokens = tokens or []
        self.prefixes: tuple[str, ...] = ()

    def resident(self) -> list[int]:
        return self.tokens

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Context]]:
    """Contexts the pool loads, as stand-ins, in order."""
    made: list[Context] = []

    def context(weights: Weights) -> Context:
        made.append(Context())
        return made[-1]

    monkeypatch.setattr(Weights, "context", context)
    yield made


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


SYSTEM_A = list(range(100, 100 + 2 * REUSE_MIN))
SYSTEM_B = list(range(500, 500 + 2 * REUSE_MIN))
OPTIONS = Options(n_ctx=64)


def pool_of(*held: list[int]) -> tuple[Pool, list[Context]]:
    pool = Pool(name="m", fd=os.open("/dev/null", os.O_RDONLY))
    contexts = [Context(tokens) for tokens in held]
    for context in contexts:
        pool.give(OPTIONS, context)  # type: ignore[arg-type]
    pool.made[OPTIONS] = len(contexts)
    return pool, contexts


def test_a_prompt_takes_the_context_holding_its_prefix(loads: list[Context]) -> None:
    pool, (a, b) = pool_of([*SYSTEM_A, 1, 2], [*SYSTEM_B, 3])
    assert pool.take(OPTIONS, [*SYSTEM_A, 9], room=2) is a  # type: ignore[comparison-overlap]
    assert pool.take(OPTIONS, [*SYSTEM_B, 9], room=2) is b  # type: ignore[comparison-overlap]
    assert loads == []
    pool.close()


def test_a_new_prefix_gets_a_new_context_while_there_is_room(loads: list[Context]) -> None:
    pool, (a,) = pool_of(SYSTEM_A)
    fresh = pool.take(OPTIONS, SYSTEM_B, room=2)
    assert fresh is loads[0] and pool.made[OPTIONS] == 2  # type: ignore[comparison-overlap]
    # kept for the prompts that want it
    assert pool.idle[OPTIONS] == [a]  # type: ignore[comparison-overlap]
    pool.close()


def test_without_room_the_least_recently_used_context_is_evicted(
        loads: list[Context]) -> None:
    pool, (old, _recent) = pool_of(SYSTEM_A, SYSTEM_B)
    assert pool.take(OPTIONS, [7] * 80, room=2) is old  # type: ignore[comparison-overlap]
    assert loads == []
    pool.close()


def test_a_context_without_a_prefix_worth_keeping_is_evicted_first(
        loads: list[Context]) -> None:
    pool, (old, short) = pool_of(SYSTEM_A, [1, 2, 3])
    old.prefixes = ("a" * 16,)
    assert pool.take(OPTIONS, SYSTEM_B, room=2) is short  # type: ignore[comparison-overlap]
    pool.close()


def test_a_short_shared_opening_is_no_reason_to_evict(loads: list[Context]) -> None:
    """A chat template's opening tokens alone do not make a context worth
    reusing while a fresh one may be made."""
    pool, (_a,) = pool_of(SYSTEM_A)
    opening = SYSTEM_A[:REUSE_MIN - 1] + [1] * 40
    assert pool.take(OPTIONS, opening, room=2) is loads[0]  # type: ignore[comparison-overlap]
    pool.close()


def test_the_cache_reports_what_idle_contexts_hold(loads: list[Context]) -> None:
    pool, (a, _b) = pool_of(SYSTEM_A, SYSTEM_B)
    a.prefixes = reported([("system", "A"), ("user", "hi")])
    assert pool.cache() == {"prefixes": sorted(a.prefixes), "cached_contexts": 1}
    taken = pool.take(OPTIONS, SYSTEM_A, room=2)
    assert taken is a and a.prefixes == ()  # type: ignore[comparison-overlap]
    assert pool.cache() == {"prefixes": [], "cached_contexts": 0}
    pool.close()


def test_a_failed_load_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    from syntrop.runtimed.protocol import Kind, WorkerError
    from syntrop.runtimed.worker.engine import LoadError

    def load(fd: int, options: Options, **_: object) -> Context:
        raise LoadError("truncated")

    monkeypatch.setattr(Engine, "load", load)
    pool, _ = pool_of()
    with pytest.raises(WorkerError) as caught:
        pool.take(OPTIONS, SYSTEM_A, room=2)
    assert caught.value.kind is Kind.INVALID_MODEL
    assert pool.made[OPTIONS] == 0
    pool.close()


def test_a_prompt_waits_for_the_cancelled_stream_holding_its_prefix(
        loads: list[Context]) -> None:
    """A client stops an answer and asks again at once: the new prompt gets
    the stopping stream's context when it is given back, not a cold one."""
    import threading
    import time

    pool, (a,) = pool_of(SYSTEM_A)
    stop = threading.Event()
    taken = pool.take(OPTIONS, [*SYSTEM_A, 1], room=2, stop=stop)
    assert taken is a  # type: ignore[comparison-overlap]
    stop.set()
    threading.Timer(0.2, pool.give, (OPTIONS, a)).start()
    started = time.monotonic()
    assert pool.take(OPTIONS, [*SYSTEM_A, 2], room=2) is a  # type: ignore[comparison-overlap]
    assert 0.15 < time.monotonic() - started < 1.5 and loads == []
    # A stream that is not stopping, and may go on long, is not waited for:
    # a context of its own.
    other = pool.take(OPTIONS, [*SYSTEM_A, 3], room=3, budget=500)
    assert other is loads[0]  # type: ignore[comparison-overlap]
    pool.close()


def test_a_prompt_waits_for_a_short_answer_holding_its_prefix(loads: list[Context]) -> None:
    import threading

    pool, (a,) = pool_of(SYSTEM_A)
    assert pool.take(OPTIONS, [*SYSTEM_A, 1], room=2, budget=4) is a  # type: ignore[comparison-overlap]
    threading.Timer(0.1, pool.give, (OPTIONS, a)).start()
    assert pool.take(OPTIONS, [*SYSTEM_A, 2], room=2) is a  # type: ignore[comparison-overlap]
    pool.close()
