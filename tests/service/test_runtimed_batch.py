"""Continuous batching over runtimed's real socket (`layout = "batch"`):
concurrent completion streams share one decode batch per model, each
stream's text equals the same request run alone, GetLoad counts the batch's
free sequences while streams run, and constraints, reasoning budgets, stop
strings and a client going away work there as they do on a context of
one's own."""

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from syntrop.interfaces.runtime import ChatMessage, Constraint, Sampling
from tests import tinymodel
from tests.models import require_llama
from tests.service.runtimed_node import Node, chunk_of, register, started

require_llama()

SLOTS = 4
PROMPTS = ["the rain", "a tree in", "the theorem", "null and true"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    config = f'[runtimed]\nlayout = "batch"\nslots = {SLOTS}\nqueue = 8\nn_ctx = 512\n'
    with started(tmp_path_factory.mktemp("batch") / "node", config) as node:
        # Endless: </s> is never the likeliest token, so streams run their length.
        register(node, {"tiny": tinymodel.write(node.root / "tiny-endless.gguf", "F32",
                                                endless=True)})
        yield node


def sampling(seed: int = 1, temperature: float = 0.0, max_tokens: int = 40,
             stop: list[str] | None = None, budget: int | None = None) -> Sampling:
    # No nucleus (top_p 1): a stream's text is compared with the same
    # request run alone, and llama.cpp's logits for a sequence differ in
    # the last bits with the number of rows sharing a decode, by CPU kernel
    # (seen with the zen4 and AMX-less variants). With top_p < 1 that noise
    # can move the nucleus boundary, which renormalises every probability,
    # and a seeded draw then picks another token; greedy choices and
    # untruncated sampling change only if logits differ by more than noise.
    return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=1.0, top_k=0,
                    seed=seed, stop=stop, min_p=0.0, reasoning_budget=budget)


async def complete(runtime: Any, prompt: str, wire: Sampling,
                   constraint: Constraint | None = None,
                   seen: asyncio.Event | None = None) -> tuple[str, Any]:
    text, last = "", None
    async for reply in runtime.Complete(model="tiny", prompt=prompt, sampling=wire,
                                        constraint=constraint):
        last = chunk_of(reply)
        text += last.text
        if seen is not None:
            seen.set()
    return text, last


def test_concurrent_streams_share_the_batch_and_match_solo_runs(node: Node) -> None:
    async def main() -> tuple[list[str], list[str], list[Any], Any]:
        async with await node.runtimed() as runtime:
            solo = [(await complete(runtime, p, sampling(seed=i, temperature=0.8 * (i % 2))))[0]
                    for i, p in enumerate(PROMPTS)]
        clients = [await node.runtimed() for _ in PROMPTS]
        try:
            seen = [asyncio.Event() for _ in PROMPTS]
            tasks = [asyncio.create_task(complete(
                client, p, sampling(seed=i, temperature=0.8 * (i % 2), max_tokens=160),
                seen=seen[i])) for i, (client, p) in enumerate(zip(clients, PROMPTS,
                                                                  strict=True))]
            await asyncio.gather(*(event.wait() for event in seen))
            async with await node.runtimed() as runtime:
                busy = await runtime.GetLoad()
            together = await asyncio.gather(*tasks)
            async with await node.runtimed() as runtime:
                idle = await runtime.GetLoad()
        finally:
            for client in clients:
                client.close()
        return solo, [t for t, _ in together], [busy, idle], together

    solo, together, (busy, idle), _ = node.run(main())
    # Each concurrent stream (longer) starts with its solo text.
    for alone, shared in zip(solo, together, strict=True):
        assert shared.startswith(alone) and len(alone) > 0
    tiny = next(m for m in busy["models"] if m.name == "tiny")
    assert tiny.batch_free < SLOTS and busy["free_slots"] < SLOTS
    tiny = next(m for m in idle["models"] if m.name == "tiny")
    assert tiny.batch_free == SLOTS and idle["free_slots"] == SLOTS


def test_constraints_stops_budgets_and_chat_in_the_batch(node: Node) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}

    async def alone(prompt: str, wire: Sampling,
                    constraint: Constraint | None = None) -> tuple[str, Any]:
        # One connection per stream: a Varlink connection carries one call at a time.
        async with await node.runtimed() as runtime:
            return await complete(runtime, prompt, wire, constraint)

    async def main() -> list[tuple[str, Any]]:
        plain = await alone("the rain", sampling(max_tokens=64))
        stop = next(plain[0][i:i + 2] for i in range(len(plain[0]) // 2, len(plain[0]) - 1)
                    if plain[0][i:i + 2].strip())
        results = await asyncio.gather(
            alone("json:", sampling(seed=2, temperature=1.0),
                  Constraint(json_schema=json.dumps(schema))),
            alone("word:", sampling(seed=3, temperature=1.0), Constraint(regex="[a-z]{3,8}")),
            alone("the rain", sampling(max_tokens=64, stop=[stop])),
            alone("<think>", sampling(seed=4, temperature=1.0, budget=3)),
        )
        chat = ""
        async with await node.runtimed() as runtime:
            async for reply in runtime.Chat(model="tiny", messages=[ChatMessage(
                    role="user", content="hi")], sampling=sampling(max_tokens=8)):
                chat += chunk_of(reply).text
        return [plain, *results, (chat, stop)]

    plain, as_json, word, stopped, thought, (chat, stop) = node.run(main())
    assert json.loads(as_json[0]).keys() == {"ok"}
    assert re.fullmatch("[a-z]{3,8}", word[0])
    assert stopped[1].finish_reason == "stop" and stop not in stopped[0]
    assert plain[0].startswith(stopped[0])
    # The budget is reached (the model thinks on) and never passed.
    assert thought[1].thinking_tokens == 3 and thought[1].answer_tokens > 0
    assert chat and not chat.isspace()


def test_a_client_going_away_frees_its_sequence(node: Node) -> None:
    async def main() -> Any:
        client = await node.runtimed()
        seen = asyncio.Event()
        task = asyncio.create_task(complete(client, "the rain",
                                            sampling(max_tokens=400), seen=seen))
        await seen.wait()
        client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        async with await node.runtimed() as runtime:
            for _ in range(100):
                load = await runtime.GetLoad()
                tiny = next(m for m in load["models"] or [] if m.name == "tiny")
                if tiny.batch_free == SLOTS and load["free_slots"] == SLOTS:
                    return load
                await asyncio.sleep(0.05)
            return load

    load = node.run(main())
    tiny = next(m for m in load["models"] if m.name == "tiny")
    assert tiny.batch_free == SLOTS and load["free_slots"] == SLOTS
