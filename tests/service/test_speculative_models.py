"""Speculative decoding on real models: greedy output equals plain greedy
decoding where the batch arithmetic is bit-identical, rejected drafts are
rolled back in the KV cache, and a draft model with another vocabulary is
refused before any token. For serving: tokens stream through on_tokens,
which can stop generation, as can a stop event; a prompt extending the
resident tokens evaluates only the new ones (counted llama_decode batches);
sampling follows llama.cpp's own sampler chain (compared with the C
samplers), is reproducible per seed, and gives the same text with any
drafter where the arithmetic is bit-identical.

Bit-identical configurations found (measured, see the report in
bench/bench_speculative.py): the tiny random model in llama.cpp's default
configuration, and SmolLM2 with n_ubatch=1 (every token of a verification
batch is computed alone, so the arithmetic is the plain decoder's). SmolLM2
with the default micro-batch verifies k+1 tokens in one matrix product
and diverges from plain decoding after some tens of tokens; the benchmark
reports where.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from syntrop.runtimed.worker import speculative as sp
from tests import tinymodel
from tests.models import require_llama, smollm2

require_llama()
#: llama.cpp runs in this process: in a child pytest of its own (tests/isolation.py).
pytestmark = pytest.mark.isolated

CODE = '''def parse(line):
    key, _, value = line.partition("=")
    return key.strip(), value.strip()


def load(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                key, value = parse(line)
                out[key] = value
    return out
'''
EDIT = ("<|im_start|>user\nAdd type hints to this Python code and return it whole:\n"
        f"```python\n{CODE}```<|im_end|>\n<|im_start|>assistant\n```python\n")


def open_llama(path: Path, **extra: Any) -> Any:
    from tests.models import Llama

    return Llama(model_path=str(path), n_ctx=512, n_threads=1, n_threads_batch=1,
                 verbose=False, **extra)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tinymodel.build(tmp_path_factory, "F32")


@pytest.fixture(scope="module")
def tiny(tiny_path: Path) -> Iterator[Any]:
    llama = open_llama(tiny_path)
    yield llama
    llama.close()


@pytest.fixture(scope="module")
def tiny_prompt(tiny: Any) -> list[int]:
    # Repetitive text, so prompt lookup finds n-grams to propose.
    return list(tiny.tokenize(("the cat sat on the mat. " * 6).encode(), add_bos=True))


def kv_end(llama: Any) -> int:
    import llama_cpp

    return int(llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(llama._ctx.ctx), 0))


def test_prompt_lookup_equals_plain_greedy_on_the_tiny_model(tiny: Any,
                                                             tiny_prompt: list[int]) -> None:
    plain = sp.Speculator(tiny, None).generate(tiny_prompt, 64)
    fast = sp.Speculator(tiny, sp.PromptLookup(), draft_max=6).generate(tiny_prompt, 64)
    assert plain.drafted == 0 and plain.steps == len(plain.tokens) - 1
    assert fast.drafted > 0
    assert fast.tokens == plain.tokens
    assert fast.reason == plain.reason
    # Every step yields the accepted drafts plus the target's own token.
    assert sum(fast.yields) + 1 == len(fast.tokens)


def test_rejected_drafts_are_rolled_back_in_the_kv_cache(tiny: Any,
                                                          tiny_prompt: list[int]) -> None:
    result = sp.Speculator(tiny, sp.PromptLookup(), draft_max=6).generate(tiny_prompt, 40)
    assert result.accepted < result.drafted  # some drafts were rejected
    # The cache ends at the last evaluated token: no rejected cell is left,
    # and the Llama object knows what is resident.
    assert kv_end(tiny) == tiny.n_tokens - 1
    assert list(tiny.input_ids[:len(tiny_prompt)]) == tiny_prompt
    assert tiny.n_tokens >= len(tiny_prompt) + len(result.tokens) - 1


def test_draft_model_with_the_same_vocabulary(tiny: Any, tiny_prompt: list[int],
                                              tiny_path: Path, tmp_path: Path) -> None:
    plain = sp.Speculator(tiny, None).generate(tiny_prompt, 48)
    other = open_llama(tinymodel.write(tmp_path / "draft.gguf", "F32", seed=99))
    itself = open_llama(tiny_path)
    try:
        weak = sp.Speculator(tiny, sp.DraftModel(tiny, other), draft_max=4).generate(
            tiny_prompt, 48)
        same = sp.Speculator(tiny, sp.DraftModel(tiny, itself), draft_max=4).generate(
            tiny_prompt, 48)
    finally:
        other.close()
        itself.close()
    assert weak.tokens == plain.tokens and same.tokens == plain.tokens
    # Other random weights rarely agree; the target's own weights always do.
    assert weak.acceptance < 0.5
    assert same.acceptance == 1.0
    assert same.steps < plain.steps / 3


def test_draft_model_with_another_vocabulary_is_refused(tiny: Any) -> None:
    draft = open_llama(smollm2())
    try:
        with pytest.raises(sp.VocabularyMismatch, match="tokens, the target has"):
            sp.DraftModel(tiny, draft)
    finally:
        draft.close()


def test_smollm2_code_edit_with_single_token_micro_batches_is_bit_identical() -> None:
    llama = open_llama(smollm2(), n_ubatch=1)
    try:
        prompt = list(llama.tokenize(EDIT.encode(), add_bos=True, special=True))
        plain = sp.Speculator(llama, None).generate(prompt, 48)
        fast = sp.Speculator(llama, sp.PromptLookup(), draft_max=6).generate(prompt, 48)
    finally:
        llama.close()
    assert fast.tokens == plain.tokens
    assert fast.accepted > 0  # the answer copies parts of the code
    assert fast.steps < plain.steps


def test_prompts_that_cannot_run_are_refused(tiny: Any) -> None:
    speculator = sp.Speculator(tiny, sp.PromptLookup())
    with pytest.raises(ValueError, match="empty prompt"):
        speculator.generate([], 4)
    with pytest.raises(ValueError, match="prompt tokens, context"):
        speculator.generate([40] * 600, 4)
    speculator.close()


# -- Serving: streaming, stopping, prefix reuse, sampling ---------------------

SAMPLED = sp.Sampler(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7)
FREE = ("<|im_start|>user\nWrite a short story about a lighthouse keeper."
        "<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every llama_decode batch (ours and llama-cpp-python's)
    while the test runs."""
    import llama_cpp
    import llama_cpp.llama_cpp as binding

    sizes: list[int] = []
    real = binding.llama_decode

    def counting(ctx: Any, batch: Any) -> int:
        sizes.append(int(batch.n_tokens))
        return int(real(ctx, batch))

    monkeypatch.setattr(binding, "llama_decode", counting)
    monkeypatch.setattr(llama_cpp, "llama_decode", counting)
    return sizes


@pytest.mark.parametrize("sampler", [None, SAMPLED], ids=["greedy", "sampled"])
def test_on_tokens_streams_every_token_once(tiny: Any, tiny_prompt: list[int],
                                            sampler: sp.Sampler | None) -> None:
    import llama_cpp

    pieces: list[list[int]] = []

    def on_tokens(step: list[int]) -> bool:
        pieces.append(list(step))
        return True

    speculator = sp.Speculator(tiny, sp.PromptLookup(), draft_max=6)
    result = speculator.generate(tiny_prompt, 48, sampler=sampler, on_tokens=on_tokens)
    speculator.close()
    assert [t for piece in pieces for t in piece] == result.tokens
    assert all(piece for piece in pieces)
    # The first token comes from the prompt's logits, then one call per
    # step that yielded tokens.
    assert len(pieces[0]) == 1
    assert [len(piece) for piece in pieces[1:]] == [y for y in result.yields if y]
    vocab = tiny._model.vocab
    assert not any(llama_cpp.llama_vocab_is_eog(vocab, t) for t in result.tokens)


def test_on_tokens_returning_false_stops(tiny: Any, tiny_prompt: list[int]) -> None:
    pieces: list[list[int]] = []

    def on_tokens(step: list[int]) -> bool:
        pieces.append(list(step))
        return len(pieces) < 3

    result = sp.Speculator(tiny, sp.PromptLookup(), draft_max=6).generate(
        tiny_prompt, 64, on_tokens=on_tokens)
    assert result.reason == "stop"
    assert len(pieces) == 3 and result.steps == 2
    assert result.tokens == [t for piece in pieces for t in piece]
    assert kv_end(tiny) == tiny.n_tokens - 1


def test_stop_event_cancels_before_the_next_step(tiny: Any, tiny_prompt: list[int]) -> None:
    import threading

    stop = threading.Event()
    calls = 0

    def on_tokens(step: list[int]) -> bool:
        nonlocal calls
        calls += 1
        if calls == 4:
            stop.set()
        return True

    speculator = sp.Speculator(tiny, sp.PromptLookup(), draft_max=6)
    result = speculator.generate(tiny_prompt, 64, on_tokens=on_tokens, stop=stop)
    assert result.reason == "cancelled"
    assert result.steps == 3 and 4 <= len(result.tokens) < 64
    assert kv_end(tiny) == tiny.n_tokens - 1
    # Set before the start: nothing is evaluated.
    before = tiny.n_tokens
    result = speculator.generate([*tiny_prompt, 40], 8, stop=stop)
    assert (result.reason, result.tokens, tiny.n_tokens) == ("cancelled", [], before)
    speculator.close()


def test_a_prompt_extending_the_resident_tokens_evaluates_only_the_new_ones(
        tiny: Any, tiny_prompt: list[int], decodes: list[int]) -> None:
    speculator = sp.Speculator(tiny, sp.PromptLookup(), draft_max=6)
    tiny.reset()
    first = speculator.generate(tiny_prompt, 24)
    assert decodes[0] == len(tiny_prompt) and first.reused == 0
    resident = tiny.n_tokens
    assert resident >= len(tiny_prompt) + len(first.tokens) - 1
    follow = [*tiny_prompt, *first.tokens, *tiny.tokenize(b" the cat", add_bos=False)]
    decodes.clear()
    second = speculator.generate(follow, 24)
    # The prefill is one batch of the tokens not yet resident.
    assert second.reused == resident
    assert decodes[0] == len(follow) - resident < 8
    # Then each step decodes the last token and its draft: nothing twice.
    assert sum(decodes) == decodes[0] + second.steps + second.drafted
    # llama-cpp-python's own generate sees what is resident: it evaluates
    # only the new tokens too.
    decodes.clear()
    again = [*follow, *second.tokens, 40]
    resident = tiny.n_tokens
    next(tiny.generate(again, temp=0.0, reset=True))
    assert decodes[0] == len(again) - resident
    speculator.close()


def test_a_diverging_prompt_drops_the_stale_tail(tiny: Any, tiny_prompt: list[int]) -> None:
    speculator = sp.Speculator(tiny, sp.PromptLookup(), draft_max=6)
    other = [*tiny_prompt[:-6], *tiny.tokenize(b" a dog ran", add_bos=False)]
    speculator.generate(tiny_prompt, 32)
    warm = speculator.generate(other, 32)
    assert warm.reused == len(tiny_prompt) - 6
    tiny.reset()
    cold = speculator.generate(other, 32)
    speculator.close()
    assert cold.reused == 0
    assert warm.tokens == cold.tokens


def test_drafts_stay_inside_the_context(tiny: Any) -> None:
    prompt = list(tiny.tokenize(("the cat sat on the mat. " * 60).encode(), add_bos=True))
    prompt = prompt[:500]
    speculator = sp.Speculator(tiny, sp.PromptLookup(), draft_max=8)
    result = speculator.generate(prompt, 100)
    speculator.close()
    assert result.reason == "length" and result.drafted > 0
    assert len(prompt) + len(result.tokens) <= 512
    assert kv_end(tiny) < 511


def test_sampling_with_a_drafter_gives_the_plain_sampler_text(
        tiny: Any, tiny_prompt: list[int], tiny_path: Path) -> None:
    """One uniform per emitted position, so the text depends on the seed only
    (the tiny model computes a batch exactly like single decodes)."""
    plain = sp.Speculator(tiny, None).generate(tiny_prompt, 48, sampler=SAMPLED)
    lookup = sp.Speculator(tiny, sp.PromptLookup(), draft_max=6).generate(
        tiny_prompt, 48, sampler=SAMPLED)
    itself = open_llama(tiny_path)
    try:
        drafted = sp.Speculator(tiny, sp.DraftModel(tiny, itself), draft_max=4).generate(
            tiny_prompt, 48, sampler=SAMPLED)
    finally:
        itself.close()
    greedy = sp.Speculator(tiny, None).generate(tiny_prompt, 48)
    assert lookup.drafted > 0 and drafted.drafted > 0
    assert lookup.tokens == plain.tokens == drafted.tokens
    assert plain.tokens != greedy.tokens
    # A greedy draft model of the same weights is accepted where the
    # sampler picked the top token, not always.
    assert 0 < drafted.acceptance < 1


def test_smollm2_sampling_is_seeded_and_drafts_are_accepted() -> None:
    import dataclasses

    llama = open_llama(smollm2(), n_ubatch=1)
    try:
        edit = list(llama.tokenize(EDIT.encode(), add_bos=True, special=True))
        free = list(llama.tokenize(FREE.encode(), add_bos=True, special=True))
        speculator = sp.Speculator(llama, sp.PromptLookup(), draft_max=6)
        first = speculator.generate(edit, 40, sampler=SAMPLED)
        again = speculator.generate(edit, 40, sampler=SAMPLED)
        plain = sp.Speculator(llama, None).generate(edit, 40, sampler=SAMPLED)
        seeds = {tuple(speculator.generate(free, 24, sampler=dataclasses.replace(
            SAMPLED, seed=seed)).tokens) for seed in (1, 2, 3)}
        speculator.close()
    finally:
        llama.close()
    assert again.tokens == first.tokens
    # n_ubatch=1 computes a batch exactly like single decodes: the drafter
    # changes the speed, not the text.
    assert plain.tokens == first.tokens
    assert first.accepted > 0  # the answer copies parts of the code
    assert len(seeds) == 3


def test_known_vocabulary_digests_are_trusted(tiny: Any, tiny_path: Path) -> None:
    other = open_llama(tiny_path)
    try:
        digest = sp.vocabulary_digest(tiny)
        sp.check_vocabulary(tiny, other, digests=(digest, digest))
        sp.check_vocabulary(tiny, other, digests=(digest, None))
        with pytest.raises(sp.VocabularyMismatch, match="different token texts"):
            sp.check_vocabulary(tiny, other, digests=(digest, "0" * 64))
        # A caller that checked already skips the check.
        sp.DraftModel(tiny, other, checked=True).close()
    finally:
        other.close()


def chain_distribution(logits: Any, sampler: sp.Sampler) -> Any:
    """The probabilities llama.cpp's own chain (llama-cpp-python's order:
    top_k, typical 1.0, top_p, min_p, temperature, dist) leaves on the
    candidates it keeps."""
    import ctypes

    import llama_cpp
    import numpy as np

    size = logits.size
    data = (llama_cpp.llama_token_data * size)()
    for i, logit in enumerate(logits):
        data[i].id, data[i].logit, data[i].p = i, float(logit), 0.0
    array = llama_cpp.llama_token_data_array(
        data=ctypes.cast(data, llama_cpp.llama_token_data_p), size=size, selected=-1,
        sorted=False)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for part in (llama_cpp.llama_sampler_init_top_k(sampler.top_k),
                 llama_cpp.llama_sampler_init_typical(1.0, 1),
                 llama_cpp.llama_sampler_init_top_p(sampler.top_p, 1),
                 llama_cpp.llama_sampler_init_min_p(sampler.min_p, 1),
                 llama_cpp.llama_sampler_init_temp(sampler.temperature),
                 llama_cpp.llama_sampler_init_dist(sampler.seed)):
        llama_cpp.llama_sampler_chain_add(chain, part)
    try:
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
        out = np.zeros(size)
        for i in range(array.size):
            out[data[i].id] = data[i].p
        return out
    finally:
        llama_cpp.llama_sampler_free(chain)


@pytest.mark.parametrize("sampler", [
    sp.Sampler(temperature=0.8),
    sp.Sampler(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    sp.Sampler(temperature=1.3, top_k=0, top_p=0.9),
    sp.Sampler(temperature=0.5, top_k=0, min_p=0.1),
    sp.Sampler(temperature=1.0, top_k=200, top_p=0.7, min_p=0.01),
])
def test_distribution_is_llama_cpp_chain(sampler: sp.Sampler) -> None:
    """The numpy distribution against the C samplers themselves, on
    SmolLM2-like logit rows (a few likely tokens over a long tail)."""
    import numpy as np

    rng = np.random.default_rng(17)
    for _ in range(10):
        logits = (rng.normal(size=3000) * 2).astype(np.float32)
        logits[rng.choice(3000, 8, replace=False)] += rng.uniform(4, 12)
        ours, theirs = sp.distribution(logits, sampler), chain_distribution(logits, sampler)
        assert set(np.flatnonzero(ours)) == set(np.flatnonzero(theirs))
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-7)
