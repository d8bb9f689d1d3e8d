"""Token log-probabilities over runtimed's real socket, SmolLM2 served both
ways a stream decodes: on a context of its own (Complete, Chat, a session's
Decode) and in the model's shared batch (layout batch). With
sampling.logprobs every chunk carries one entry per token, each at most 0
with its alternatives most likely first, greedy picks the first of them,
and the entries' bytes spell the text; without it the field stays null;
out of range, or with speculative decoding, is InvalidSampling before any
token. Only structure and consistency are checked, never the words."""

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from syntrop.interfaces.runtime import (
    ChatMessage,
    Constraint,
    InvalidSampling,
    Sampling,
    Speculative,
)
from tests.models import require_llama
from tests.service.runtimed_node import Node, chunk_of, manifest, started

require_llama()

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module", params=["auto", "batch"])
def node(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    config = f'[runtimed]\nlayout = "{request.param}"\nslots = 2\nn_ctx = 512\n'
    with started(tmp_path_factory.mktemp(request.param) / "node", config) as node:
        async def first() -> None:  # socket activation: runtimed starts here, not in a test
            async with await node.runtimed() as runtime:
                await runtime.GetLoad()

        node.run(first())
        yield node


def sampling(logprobs: int | None = 3, *, temperature: float = 0.0, max_tokens: int = 24,
             speculative: Speculative | None = None) -> Sampling:
    return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=None, top_k=None,
                    seed=7, stop=None, logprobs=logprobs, speculative=speculative)


async def chunks(replies: AsyncIterator[Any]) -> list[Any]:
    return [chunk_of(reply) async for reply in replies]


def check(stream: list[Any], top: int, *, greedy: bool) -> None:
    """The entries of a stream with logprobs `top` are consistent with it."""
    *pieces, last = stream
    assert last.finish_reason is not None and last.logprobs is None
    assert pieces and sum(c.tokens for c in pieces) > 0
    entries = []
    for chunk in pieces:
        assert chunk.logprobs is not None and len(chunk.logprobs) == chunk.tokens
        entries += chunk.logprobs
    for entry in entries:
        assert entry.logprob <= 0.0
        assert len(entry.top) == top
        values = [t.logprob for t in entry.top]
        assert values == sorted(values, reverse=True) and all(v <= 0.0 for v in values)
        if top:
            assert entry.logprob <= entry.top[0].logprob + 1e-6
        if greedy and top:
            assert (entry.token, entry.bytes) == (entry.top[0].token, entry.top[0].bytes)
            assert entry.logprob == pytest.approx(entry.top[0].logprob)
        assert entry.token == bytes(entry.bytes).decode(errors="replace")
    text = "".join(c.text for c in pieces)
    assert bytes(b for e in entries for b in e.bytes).decode(errors="replace") == text
    if not any("\ufffd" in e.token for e in entries):
        assert "".join(e.token for e in entries) == text


def test_complete_and_chat_carry_logprobs(node: Node) -> None:
    async def main() -> list[list[Any]]:
        async with await node.runtimed() as runtime:
            return [
                await chunks(runtime.Complete(model="smollm2", prompt=PROMPT,
                                              sampling=sampling(3))),
                await chunks(runtime.Chat(model="smollm2", messages=[ChatMessage(
                    role="user", content="Name a colour.")], sampling=sampling(3))),
                await chunks(runtime.Complete(model="smollm2", prompt=PROMPT,
                                              sampling=sampling(0))),
                await chunks(runtime.Complete(model="smollm2", prompt=PROMPT,
                                              sampling=sampling(20, temperature=1.0))),
                await chunks(runtime.Complete(model="smollm2", prompt="word:",
                                              sampling=sampling(2, temperature=1.0),
                                              constraint=Constraint(regex="[a-z]{3,8}"))),
            ]

    complete, chat, none_top, sampled, constrained = node.run(main())
    check(complete, 3, greedy=True)
    check(chat, 3, greedy=True)
    check(none_top, 0, greedy=True)
    check(sampled, 20, greedy=False)
    check(constrained, 2, greedy=False)
    # logprobs 0 and 3 of the same greedy request: the same tokens and
    # numbers (but for the last bits: a context reused re-evaluates a token).
    three = [e for c in complete[:-1] for e in c.logprobs]
    zero = [e for c in none_top[:-1] for e in c.logprobs]
    assert [e.token for e in three] == [e.token for e in zero]
    assert [e.logprob for e in three] == pytest.approx([e.logprob for e in zero], abs=1e-3)


def test_without_logprobs_the_field_is_null(node: Node) -> None:
    async def main() -> list[Any]:
        async with await node.runtimed() as runtime:
            return await chunks(runtime.Complete(model="smollm2", prompt=PROMPT,
                                                 sampling=sampling(None)))

    stream = node.run(main())
    assert sum(c.tokens for c in stream) > 0
    assert all(c.logprobs is None for c in stream)


def test_session_decode_carries_logprobs(node: Node) -> None:
    async def main() -> list[Any]:
        async with await node.runtimed() as runtime:
            opened = await runtime.OpenSession(owner_instance_id="owner-1", model="smollm2",
                                               config=None)
            sid = opened["session_id"]
            try:
                await runtime.EnsurePrefix(session_id=sid, text=PROMPT, manifest=manifest())
                return await chunks(runtime.Decode(session_id=sid, sampling=sampling(3)))
            finally:
                await runtime.Close(session_id=sid)

    check(node.run(main()), 3, greedy=True)


@pytest.mark.parametrize("wire", [sampling(21), sampling(-1),
                                  sampling(1, speculative=Speculative())],
                         ids=["21", "-1", "speculative"])
def test_out_of_range_or_speculative_is_invalid_sampling(node: Node, wire: Sampling) -> None:
    async def main() -> None:
        async with await node.runtimed() as runtime:
            with pytest.raises(InvalidSampling) as caught:
                await chunks(runtime.Complete(model="smollm2", prompt=PROMPT, sampling=wire))
            assert caught.value.parameters["parameter"] == "logprobs"
            assert (await runtime.GetLoad())["free_slots"] == 2

    node.run(main())
