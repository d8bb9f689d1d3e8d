"""A pool's contexts share one load of the model's weights (worker/pool.py,
engine.Weights): one load for three contexts, each decoding as a context
loaded alone does, and each context after the first costing far less
memory than the model file."""

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from syntrop.runtimed.protocol import Options
from syntrop.runtimed.sampling import Params
from syntrop.runtimed.worker.engine import Engine
from syntrop.runtimed.worker.pool import Pool
from tests import models

models.require_llama()

OPTIONS = Options(n_ctx=256, n_batch=32, n_threads=2)
GREEDY = Params(max_tokens=8, temperature=0.0, top_k=1, top_p=1.0, min_p=0.0)
PROMPT = "The capital of France is"


def rss() -> int:
    """This process's resident set, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def greedy(engine: Engine) -> list[int]:
    """The prompt and the tokens greedy decoding adds to it."""
    tokens = engine.tokenize(PROMPT, add_bos=True)
    engine.generate(tokens, GREEDY, threading.Event(), lambda *_: None)
    return engine.continuation()


@pytest.fixture
def path() -> Path:
    return models.smollm2()


@pytest.fixture
def pool(path: Path) -> Iterator[Pool]:
    pool = Pool.open("smollm2", os.open(path, os.O_RDONLY))
    yield pool
    pool.close()


def test_three_contexts_one_load(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[Options] = []
    load = Engine.load

    def counted(fd: int, options: Options, **kwargs: object) -> Engine:
        loads.append(options)
        return load(fd, options, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "load", counted)
    engines = [pool.take(OPTIONS, room=3) for _ in range(3)]
    assert len({id(e) for e in engines}) == 3
    assert loads == [OPTIONS]
    assert all(e.llama._model is engines[0].llama._model for e in engines)
    assert len({id(e.llama._ctx.ctx) for e in engines}) == 3
    for engine in engines:
        pool.give(OPTIONS, engine)


def test_shared_contexts_decode_as_one_alone(pool: Pool, path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        alone = Engine.load(fd, OPTIONS)
        expected = greedy(alone)
        alone.close()
    finally:
        os.close(fd)
    engines = [pool.take(OPTIONS, room=3) for _ in range(3)]
    assert all(e.llama._model is engines[0].llama._model for e in engines)
    assert len(expected) > len(engines[0].tokenize(PROMPT, add_bos=True))
    for engine in engines:
        assert greedy(engine) == expected
    # A context closed and made again over the same weights decodes the same.
    pool.give(OPTIONS, engines[0])
    engines[0].close()
    pool.idle[OPTIONS].clear()
    pool.made[OPTIONS] -= 1
    again = pool.take(OPTIONS, room=3)
    assert greedy(again) == expected
    for engine in [again, *engines[1:]]:
        pool.give(OPTIONS, engine)


def test_later_contexts_cost_their_cache_not_the_weights(pool: Pool, path: Path) -> None:
    size = path.stat().st_size
    first = pool.take(OPTIONS, room=3)
    greedy(first)
    engines = [first]
    for _ in range(2):
        before = rss()
        engine = pool.take(OPTIONS, room=3)
        greedy(engine)
        grown = rss() - before
        assert grown < size // 2, f"a context grew RSS by {grown} bytes ({size} the model)"
        engines.append(engine)
    for engine in engines:
        pool.give(OPTIONS, engine)


def test_trim_frees_the_weights_with_the_last_context(pool: Pool) -> None:
    engine = pool.take(OPTIONS, room=3)
    pool.give(OPTIONS, engine)
    assert OPTIONS in pool.weights
    assert pool.trim() == 1
    assert pool.weights == {}
    again = pool.take(OPTIONS, room=3)  # loads them again
    assert again.llama._model.model is not None
    pool.give(OPTIONS, again)


def test_a_context_in_use_outlives_the_pool(path: Path) -> None:
    pool = Pool.open("smollm2", os.open(path, os.O_RDONLY))
    idle, busy = pool.take(OPTIONS, room=2), pool.take(OPTIONS, room=2)
    pool.give(OPTIONS, idle)
    pool.close()
    assert pool.weights  # held for the context still in use
    assert len(greedy(busy)) > 0
    pool.give(OPTIONS, busy)
    assert pool.weights == {}
