"""Speculative decoding over runtimed's real socket: the tiny model as
target, its Q8_0 copy (the same vocabulary) as draft model, and prompt
lookup. Greedy output equals plain decoding (the tiny model's batch
arithmetic is bit-identical, see test_speculative_models.py), in
completions and in a session's Decode; the last chunk reports drafted and
accepted tokens; sampling is reproducible per seed; a draft model with
another vocabulary, an unknown draft, a bad draft_max, and speculation with
a constraint or a reasoning budget are declared errors before any token."""

from collections.abc import Iterator
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.interfaces.runtime import (
    Constraint,
    InvalidConstraint,
    InvalidSampling,
    ModelNotFound,
    Sampling,
    SessionConfig,
    Speculative,
    VocabularyMismatch,
)
from tests import tinymodel
from tests.models import require_llama
from tests.service.runtimed_node import Node, chunk_of, manifest, register, started

require_llama()

#: Repeats itself, so prompt lookup has something to draft from.
PROMPT = "the rain in the trees, the rain in the trees, the rain in the"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    files = {"tiny": tinymodel.build(tmp_path_factory, "F32"),
             "tiny-q8": tinymodel.build(tmp_path_factory, "Q8_0")}
    with started(tmp_path_factory.mktemp("speculative") / "node") as node:
        register(node, files)
        yield node


def sampling(speculative: Speculative | None = None, *, temperature: float = 0.0,
             seed: int = 1, max_tokens: int = 48, stop: list[str] | None = None,
             budget: int | None = None) -> Sampling:
    return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=None, top_k=0,
                    seed=seed, stop=stop, min_p=0.0, reasoning_budget=budget,
                    speculative=speculative)


def complete(node: Node, wire: Sampling, prompt: str = PROMPT,
             constraint: Constraint | None = None, model: str = "tiny") -> tuple[str, Any]:
    async def main() -> tuple[str, Any]:
        text, last = "", None
        async with await node.runtimed() as runtime:
            async for reply in runtime.Complete(model=model, prompt=prompt, sampling=wire,
                                                constraint=constraint):
                last = chunk_of(reply)
                text += last.text
        return text, last
    result: tuple[str, Any] = node.run(main())
    return result


LOOKUP = Speculative(draft=None, draft_max=4)
DRAFT = Speculative(draft="tiny-q8", draft_max=4)


@pytest.mark.parametrize("spec", [LOOKUP, DRAFT], ids=["lookup", "draft"])
def test_greedy_speculation_gives_the_plain_text(node: Node, spec: Speculative) -> None:
    plain, plain_last = complete(node, sampling())
    text, last = complete(node, sampling(spec))
    assert text == plain and len(plain) > 0
    assert last.finish_reason == plain_last.finish_reason
    assert plain_last.drafted_tokens is None
    assert last.drafted_tokens is not None and last.accepted_tokens is not None
    assert 0 <= last.accepted_tokens <= last.drafted_tokens
    if spec.draft is not None:
        # The draft is the same network in Q8_0: it mostly agrees.
        assert last.accepted_tokens > last.drafted_tokens // 2


def test_a_draft_context_serves_its_own_model_afterwards(node: Node) -> None:
    """Drafting rewrites the draft model's context; when that context goes
    back to the draft model's pool, its own requests must not reuse cells
    they did not write (a prompt sharing a prefix would read the target's
    context instead)."""
    other = PROMPT + " and the sun"
    before, _ = complete(node, sampling(), prompt=other, model="tiny-q8")
    complete(node, sampling(DRAFT), prompt=PROMPT)
    after, _ = complete(node, sampling(), prompt=other, model="tiny-q8")
    assert after == before and before


def test_stop_strings_end_a_speculative_stream_as_a_plain_one(node: Node) -> None:
    plain, _ = complete(node, sampling(max_tokens=64))
    stop = plain[len(plain) // 2:len(plain) // 2 + 2]
    assert stop.strip()
    cut, cut_last = complete(node, sampling(max_tokens=64, stop=[stop]))
    text, last = complete(node, sampling(LOOKUP, max_tokens=64, stop=[stop]))
    assert text == cut and stop not in text
    assert last.finish_reason == cut_last.finish_reason == "stop"


def test_sampling_is_reproducible_per_seed(node: Node) -> None:
    texts = {seed: complete(node, sampling(DRAFT, temperature=0.9, seed=seed))[0]
             for seed in (5, 6, 7)}
    assert complete(node, sampling(DRAFT, temperature=0.9, seed=5))[0] == texts[5]
    assert len(set(texts.values())) > 1


def test_a_session_decodes_speculatively(node: Node) -> None:
    async def decode(spec: Speculative | None) -> tuple[str, Any]:
        async with await node.runtimed() as runtime:
            opened = await runtime.OpenSession(
                owner_instance_id="speculative", model="tiny",
                config=SessionConfig(n_ctx=256, n_batch=None, n_threads=1, n_gpu_layers=None,
                                     flash_attn=None, kv_cache_type=None, prompt_format=None,
                                     disable_bos=None))
            sid = opened["session_id"]
            try:
                await runtime.EnsurePrefix(session_id=sid, text=PROMPT,
                                           manifest=manifest(model="tiny"))
                text, last = "", None
                for _ in range(2):  # twice: the second continues the first
                    async for reply in runtime.Decode(session_id=sid,
                                                      sampling=sampling(spec, max_tokens=24)):
                        last = chunk_of(reply)
                        text += last.text
                return text, last
            finally:
                await runtime.Close(session_id=sid)

    plain, _ = node.run(decode(None))
    text, last = node.run(decode(DRAFT))
    assert text == plain and last.drafted_tokens is not None


@pytest.mark.parametrize("wire, constraint, kind, parameter", [
    (sampling(Speculative(draft="smollm2")), None, VocabularyMismatch, "draft"),
    (sampling(Speculative(draft="no-such-model")), None, ModelNotFound, "model"),
    (sampling(Speculative(draft_max=0)), None, InvalidSampling, "parameter"),
    (sampling(Speculative(draft_max=17)), None, InvalidSampling, "parameter"),
    (sampling(LOOKUP, budget=4), None, InvalidSampling, "parameter"),
    (sampling(LOOKUP), Constraint(regex="[a-z]+"), InvalidConstraint, "reason"),
], ids=["other-vocabulary", "unknown-draft", "draft-max-0", "draft-max-17", "budget",
        "constraint"])
def test_bad_speculation_is_refused_before_any_token(node: Node, wire: Sampling,
                                                     constraint: Constraint | None,
                                                     kind: type, parameter: str) -> None:
    async def main() -> None:
        async with await node.runtimed() as runtime:
            async for _ in runtime.Complete(model="tiny", prompt=PROMPT, sampling=wire,
                                            constraint=constraint):
                pytest.fail("a token came before the error")
    with pytest.raises(VarlinkErrorReply) as raised:
        node.run(main())
    assert isinstance(raised.value, kind), raised.value
    assert raised.value.paramstojson()[parameter]

    async def load() -> Any:
        async with await node.runtimed() as runtime:
            return await runtime.GetLoad()
    status = node.run(load())
    assert status["free_slots"] == status["total_slots"]
    # Neither the target nor a draft is still held by the refused request.
    assert all(model.busy == 0 for model in status["models"]), status["models"]
