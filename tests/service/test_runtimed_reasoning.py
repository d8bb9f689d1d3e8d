"""Reasoning budgets over runtimed's real socket: the tiny model (whose
vocabulary has <think> and </think>) registered in modeld, streams with a
thinking budget, thinking marked apart from the answer, markers never in the
text, counts on the last chunk; SmolLM2 (no markers) and a budget with a
constraint answered with declared errors."""

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.interfaces.model import Model1
from syntrop.interfaces.runtime import (
    Constraint,
    InvalidConstraint,
    InvalidSampling,
    Runtime1,
    Sampling,
)
from syntrop.varlink.client import connect
from tests import tinymodel
from tests.models import require_llama
from tests.service.runtimed_node import Node, started

require_llama()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tiny = tinymodel.build(tmp_path_factory, "Q8_0")
    digest = hashlib.sha256(tiny.read_bytes()).hexdigest()
    with ExitStack() as stack:
        node = stack.enter_context(started(tmp_path_factory.mktemp("reasoning") / "node"))

        async def register() -> None:
            async with await connect(Model1, address=node.model, timeout=60) as modeld:
                await modeld.Register(name="tiny", path=str(tiny), sha256=digest)
            # runtimed starts on its first connection: here, not inside a test.
            async with await connect(Runtime1, address=node.runtime, timeout=60) as runtime:
                async for _ in runtime.Complete(model="tiny", prompt="a", sampling=sampling(
                        1, None, max_tokens=1)):
                    pass
        node.run(register())
        yield node


def sampling(seed: int, budget: int | None, max_tokens: int = 48) -> Sampling:
    return Sampling(max_tokens=max_tokens, temperature=1.0, top_p=None, top_k=0, seed=seed,
                    stop=None, min_p=0.0, reasoning_budget=budget)


def stream(node: Node, prompt: str, wire: Sampling, model: str = "tiny") -> list[Any]:
    async def main() -> list[Any]:
        chunks = []
        async with await node.runtimed() as runtime:
            async for reply in runtime.Complete(model=model, prompt=prompt, sampling=wire):
                chunks.append(reply["chunk"] if isinstance(reply, dict) else reply)
        return chunks
    result: list[Any] = node.run(main())
    return result


@pytest.mark.parametrize("budget", [0, 3, 12])
def test_thinking_stops_at_the_budget_and_the_answer_follows(node: Node, budget: int) -> None:
    reached = []
    for seed in range(4):
        chunks = stream(node, "<think>", sampling(seed, budget))
        last = chunks[-1]
        thinking = [c for c in chunks[:-1] if c.thinking]
        answer = [c for c in chunks[:-1] if not c.thinking]
        assert last.finish_reason in ("stop", "length")
        assert last.thinking_tokens is not None and last.thinking_tokens <= budget
        # Thinking text came marked; its tokens include the two markers' worth
        # of empty pieces, never more thinking than the budget.
        assert sum(c.tokens for c in thinking if c.text) <= budget
        text = "".join(c.text for c in answer)
        assert "<think>" not in text and "</think>" not in text
        assert last.answer_tokens == sum(c.tokens for c in answer)
        # 48 tokens were asked for: the budget left room for an answer.
        assert last.thinking_tokens + last.answer_tokens <= 48
        assert last.answer_tokens > 0 or last.finish_reason == "stop"
        reached.append(last.thinking_tokens == budget)
    # A random-weight model rarely closes its thinking by itself: the budget did.
    assert any(reached)


def test_without_a_budget_nothing_is_marked(node: Node) -> None:
    chunks = stream(node, "<think>", sampling(1, None, max_tokens=8))
    assert all(c.thinking is None for c in chunks)
    assert chunks[-1].thinking_tokens is None and chunks[-1].answer_tokens is None


def test_a_model_without_markers_refuses_a_budget(node: Node) -> None:
    with pytest.raises(VarlinkErrorReply) as raised:
        stream(node, "Hi", sampling(1, 4), model="smollm2")
    assert isinstance(raised.value, InvalidSampling)
    assert raised.value.parameters["parameter"] == "reasoning_budget"
    # The slot came back: the next request runs.
    assert stream(node, "Hi", sampling(1, None, max_tokens=2), model="smollm2")[-1].finish_reason


@pytest.mark.parametrize("budget", [-1, 1 << 30])
def test_budgets_out_of_range_are_invalid_sampling(node: Node, budget: int) -> None:
    with pytest.raises(VarlinkErrorReply) as raised:
        stream(node, "<think>", sampling(1, budget))
    assert isinstance(raised.value, InvalidSampling)


def test_a_budget_with_a_constraint_is_refused_before_any_token(node: Node) -> None:
    async def main() -> None:
        async with await node.runtimed() as runtime:
            async for _ in runtime.Complete(model="tiny", prompt="<think>",
                                            sampling=sampling(1, 4),
                                            constraint=Constraint(regex="(a|b)")):
                pytest.fail("a token came before the error")
    with pytest.raises(VarlinkErrorReply) as raised:
        node.run(main())
    assert isinstance(raised.value, InvalidConstraint)
