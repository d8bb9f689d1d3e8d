"""Reasoning budget: state, counts and masks, on plain arrays (no model)."""

import numpy as np
import pytest

from syntrop.runtimed.worker.reasoning import ANSWER, MARKER, THINKING, Reasoning

START, END, VOCAB = 3, 4, 16


def step(r: Reasoning, context: list[int]) -> np.ndarray:
    return np.asarray(r(list(context), np.zeros(VOCAB, dtype=np.float32)))


def test_budget_forces_the_end_marker() -> None:
    r = Reasoning(start=START, end=END, budget=3)
    context = [1, 7, START]
    assert np.isfinite(step(r, context)).all()  # prompt ends thinking: still free
    assert r.state == THINKING
    for token in (8, 9, 10):
        assert r.feed(token) == THINKING
        context.append(token)
        scores = step(r, context)
    # three thinking tokens: only the end marker is left
    assert np.isfinite(scores).sum() == 1 and scores[END] == 0.0
    assert r.forced
    assert r.feed(END) == MARKER
    context.append(END)
    scores = step(r, context)
    assert r.state == ANSWER
    assert scores[START] == -np.inf and scores[END] == -np.inf
    assert np.isfinite(np.delete(scores, [START, END])).all()
    assert r.feed(11) == ANSWER
    assert (r.thinking_tokens, r.answer_tokens) == (3, 1)


def test_thinking_cannot_end_the_generation() -> None:
    r = Reasoning(start=START, end=END, budget=5, eog=[2, 15])
    scores = step(r, [1, START])
    assert scores[2] == -np.inf and scores[15] == -np.inf
    assert np.isfinite(np.delete(scores, [2, 15])).all()
    r.feed(END)
    scores = step(r, [1, START, END])
    assert np.isfinite(scores[[2, 15]]).all()


def test_tokens_are_counted_once_whoever_sees_them_first() -> None:
    r = Reasoning(start=START, end=END, budget=10)
    context = [1, START]
    step(r, context)
    context += [8, 9]
    step(r, context)  # the processor catches up on both
    assert r.thinking_tokens == 2
    assert r.feed(10) == THINKING  # the caller feeds the next one first
    context.append(10)
    step(r, context)
    assert r.thinking_tokens == 3


def test_natural_end_within_budget() -> None:
    r = Reasoning(start=START, end=END, budget=100)
    step(r, [1, START])
    assert [r.feed(t) for t in (8, END, 9, 10)] == [THINKING, MARKER, ANSWER, ANSWER]
    assert not r.forced
    assert (r.thinking_tokens, r.answer_tokens) == (1, 2)


def test_model_opens_thinking_itself() -> None:
    r = Reasoning(start=START, end=END, budget=0)
    assert np.isfinite(step(r, [1, 7])).all()
    assert r.state is None
    assert r.feed(START) == MARKER
    scores = step(r, [1, 7, START])
    assert np.isfinite(scores).sum() == 1 and scores[END] == 0.0  # budget 0


def test_no_thinking_at_all() -> None:
    r = Reasoning(start=START, end=END, budget=5)
    step(r, [1, START, 8, END, 7])  # an earlier turn thought and ended
    assert r.state is None
    assert r.feed(9) == ANSWER
    scores = step(r, [1, START, 8, END, 7, 9])
    assert scores[START] == -np.inf and scores[END] == -np.inf


def test_explicit_state_and_unlimited_budget() -> None:
    r = Reasoning(start=START, end=END, budget=None, thinking=True)
    step(r, [1])
    for _ in range(50):
        assert r.feed(8) == THINKING
    assert not r.must_end
    with pytest.raises(ValueError):
        Reasoning(start=START, end=END, budget=-1)
