"""The prefill hand-off between two real runtimed (the fleet's, without
routerd): one prefills a long chat (Runtime1.Prefill, in 1024-token
steps), the other answers it from that state (Chat's prefix_state). The
answer is the same greedy text as prefilling at home, token for token, and
the home computed only the prompt's last token; a state of another prompt
or model file, or bytes that are not a state, change nothing but the
prompt's cost. A context a state went into answers its own request
only: no other chat is answered from that KV, nor is its prefix reported;
a state not in a sealed memfd is not used."""

import fcntl
import os
from collections.abc import Iterator
from typing import Any

import pytest

from syntrop.interfaces.runtime import ChatMessage
from syntrop.varlink import FileDescriptor
from tests.service.runtimed_node import Node, chunk_of, greedy, started

CONFIG = "[runtimed]\nslots = 1\nn_ctx = 4096\n"


def chat(topic: str, rules: int = 160) -> list[ChatMessage]:
    """A system prompt of about 15 tokens a rule (2,400 by default: three
    of the helper's steps) and a question."""
    text = " ".join(f"Rule {i}: answers about {topic} stay short, calm and sourced."
                    for i in range(rules))
    return [ChatMessage(role="system", content=f"You are a guide to {topic}. {text}"),
            ChatMessage(role="user", content=f"Name one famous place for {topic}.")]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node]]:
    root = tmp_path_factory.mktemp("handoff")
    with started(root / "helper", CONFIG) as helper, started(root / "home", CONFIG) as home:
        for node in (helper, home):  # runtimed started here, not inside a test
            node.run(cold(node))
        yield helper, home


async def answer(node: Node, messages: list[ChatMessage],
                 state: int | None = None) -> tuple[str, Any]:
    """The greedy answer and its last chunk (prompt and cached tokens)."""
    async with await node.runtimed() as runtime:
        text, last = "", None
        async for reply in runtime.Chat(
                model="smollm2", messages=messages, sampling=greedy(max_tokens=24),
                prefix_state=None if state is None else FileDescriptor(state)):
            last = chunk_of(reply)
            text += last.text
        return text, last


async def prefill(node: Node, messages: list[ChatMessage]) -> tuple[int, Any]:
    """A state of `messages`' prompt: a descriptor of ours, and the reply."""
    async with await node.runtimed() as runtime:
        with await runtime.Prefill(model="smollm2", messages=messages) as reply:
            return os.dup(reply["state"].fileno()), reply


def sealed(data: bytes) -> int:
    """A memfd of `data`, sealed as runtimed takes a state."""
    fd = os.memfd_create("test-state", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def unsealed(state: int) -> int:
    """A plain memfd of `state`'s bytes."""
    fd = os.memfd_create("test-state")
    os.write(fd, os.pread(state, os.fstat(state).st_size, 0))
    return fd


async def prefixes(node: Node) -> list[str]:
    """The chat prefixes `node` says its idle contexts hold."""
    async with await node.runtimed() as runtime:
        return [d for m in (await runtime.GetLoad())["models"] or [] for d in m.prefixes or []]


async def cold(node: Node) -> None:
    """Nothing resident on `node` any more: the model's contexts closed."""
    async with await node.runtimed() as runtime:
        await runtime.Unload(model="smollm2")


def test_hand_off_changes_no_token_and_skips_the_prefill(nodes: tuple[Node, Node]) -> None:
    helper, home = nodes
    messages = chat("rivers")
    state, reply = helper.run(prefill(helper, messages))
    try:
        assert reply["prefilled_tokens"] == reply["tokens"] > 2048  # three steps
        assert os.fstat(state).st_size > reply["tokens"] * 4
        home.run(cold(home))
        handed, last = home.run(answer(home, messages, state))
    finally:
        os.close(state)
    # The home evaluated only the last prompt token: the rest came handed.
    assert last.prompt_tokens == reply["tokens"] + 1
    assert last.cached_tokens == reply["tokens"]
    home.run(cold(home))
    prefilled, baseline = home.run(answer(home, messages))
    assert baseline.cached_tokens == 0
    assert handed == prefilled and handed.strip()


def test_a_state_of_another_prompt_model_or_no_state_is_not_used(
        nodes: tuple[Node, Node]) -> None:
    helper, home = nodes
    other, _ = helper.run(prefill(helper, chat("deserts", 20)))
    # The right prompt's state, marked as of another model file (another
    # quantisation under the same name would be).
    right, _ = helper.run(prefill(helper, chat("lakes", 20)))
    foreign = sealed(b"f" * 64 + os.pread(right, os.fstat(right).st_size, 0)[64:])
    garbage = sealed(b"\x07" * 4096)
    try:
        for state in (other, foreign, garbage):
            home.run(cold(home))
            text, last = home.run(answer(home, chat("lakes", 20), state))
            assert last.cached_tokens == 0 and text.strip()
    finally:
        for fd in (other, right, foreign, garbage):
            os.close(fd)


def test_a_state_in_an_unsealed_memfd_is_not_used(nodes: tuple[Node, Node]) -> None:
    helper, home = nodes
    messages = chat("lakes", 20)
    state, _ = helper.run(prefill(helper, messages))
    try:
        copy = unsealed(state)
        home.run(cold(home))
        text, last = home.run(answer(home, messages, copy))
    finally:
        os.close(state)
        os.close(copy)
    assert last.cached_tokens == 0 and text.strip()


def test_a_restored_context_answers_no_other_chat(nodes: tuple[Node, Node]) -> None:
    """A chat answered from a handed-in state, then another chat with the
    same system prompt on the same node: the second finds none of it
    resident, and no prefix of the first is reported, whereas a chat the
    node prefilled itself leaves its prefix for the next."""
    helper, home = nodes
    first = chat("mountains", 40)
    second = [first[0], ChatMessage(role="user", content="Name the highest one.")]
    third = [first[0], ChatMessage(role="user", content="Name the oldest one.")]
    state, reply = helper.run(prefill(helper, first))
    try:
        home.run(cold(home))
        _, handed = home.run(answer(home, first, state))
    finally:
        os.close(state)
    assert handed.cached_tokens == reply["tokens"]  # the state was used
    assert home.run(prefixes(home)) == []
    _, other = home.run(answer(home, second))
    assert other.cached_tokens == 0
    # Prefilled at home, the same system prompt is reused and reported.
    assert home.run(prefixes(home))
    _, again = home.run(answer(home, third))
    assert again.cached_tokens > 100
