"""Reasoning budgets on the tiny model, whose vocabulary has <think> and
</think>: llama-cpp-python's own generate loop with `Reasoning` as its logits
processor and stream filter, as runtimed's engine drives it."""

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from syntrop.runtimed.worker.reasoning import (
    ANSWER,
    MARKER,
    THINKING,
    Reasoning,
    ReasoningError,
    markers,
)
from tests import tinymodel
from tests.models import require_llama, smollm2

require_llama()
#: llama.cpp runs in this process: in a child pytest of its own (tests/isolation.py).
pytestmark = pytest.mark.isolated


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.models import Llama

    model = Llama(model_path=str(tinymodel.build(tmp_path_factory, "Q8_0")), n_ctx=512,
                  n_threads=2, verbose=False)
    yield model
    model.close()


def run(llama: Any, processors: list[Any], reasoning: Reasoning, prompt: str, seed: int,
        limit: int) -> dict[str, list[int]]:
    """Generate; the tokens by kind."""
    import llama_cpp

    llama.set_seed(seed)
    tokens = llama.tokenize(prompt.encode(), add_bos=False, special=True)
    kinds: dict[str, list[int]] = {THINKING: [], ANSWER: [], MARKER: []}
    for token in llama.generate(tokens, temp=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                logits_processor=llama_cpp.LogitsProcessorList(processors)):
        if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            break
        kinds[reasoning.feed(token)].append(token)
        if sum(map(len, kinds.values())) >= limit:
            break
    return kinds


def test_markers_of_the_tiny_model(llama: Any) -> None:
    assert markers(llama) == (tinymodel.THINK, tinymodel.END_THINK)


def test_a_model_without_markers_is_refused() -> None:
    from tests.models import Llama

    model = Llama(model_path=str(smollm2()), vocab_only=True, verbose=False)
    try:
        with pytest.raises(ReasoningError):
            markers(model)
    finally:
        model.close()


@pytest.mark.parametrize("budget", [0, 1, 8, 24])
def test_budget_is_enforced(llama: Any, budget: int) -> None:
    start, end = markers(llama)
    forced = 0
    for seed in range(8):
        r = Reasoning(start=start, end=end, budget=budget, eog=[tinymodel.EOS])
        kinds = run(llama, [r], r, "<s>user\nthink briefly</s>\n<s>assistant\n<think>", seed,
                    limit=budget + 20)
        assert r.thinking_tokens == len(kinds[THINKING]) <= budget
        assert r.answer_tokens == len(kinds[ANSWER])
        # exactly one marker, the end of thinking, and then the answer
        assert end in kinds[MARKER]
        assert start not in kinds[ANSWER] and end not in kinds[ANSWER]
        text = llama.detokenize(kinds[ANSWER], special=False)
        assert b"<think>" not in text and b"</think>" not in text
        forced += r.forced
    assert forced >= 6  # a random model rarely closes thinking by itself


def test_markers_never_reach_the_answer(llama: Any) -> None:
    """A processor that pushes both markers hard, ahead of the budget: the
    model closes thinking at once, then the answer still holds no marker."""
    start, end = markers(llama)

    def push(_: Any, scores: Any) -> Any:
        scores[start] += 1000.0
        scores[end] += 1000.0
        return scores

    for seed in range(4):
        r = Reasoning(start=start, end=end, budget=50)
        kinds = run(llama, [push, r], r, "<s>assistant\n<think>", seed, limit=30)
        assert r.thinking_tokens == 0 and not r.forced
        # (an extra <think> while thinking is a marker too, never counted)
        assert kinds[MARKER][-1] == end and end not in kinds[MARKER][:-1]
        assert len(kinds[ANSWER]) == 30 - len(kinds[MARKER])
        assert not {start, end} & set(kinds[ANSWER])


def test_without_the_filter_markers_would_leak(llama: Any) -> None:
    """The same push with no Reasoning in the list: markers fill the output
    (so the test above can fail)."""
    start, end = markers(llama)

    def push(_: Any, scores: Any) -> Any:
        scores[start] += 1000.0
        scores[end] += 1000.0
        return scores

    r = Reasoning(start=start, end=end, budget=50)
    kinds = run(llama, [push], r, "<s>assistant\n<think>", 0, limit=10)
    assert len(kinds[MARKER]) == 10
    assert np.isin(kinds[MARKER], [start, end]).all()
