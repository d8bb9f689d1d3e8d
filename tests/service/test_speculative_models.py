"""Speculative decoding on real models: greedy output equals plain greedy
decoding where the batch arithmetic is bit-identical, rejected drafts are
rolled back in the KV cache, and a draft model with another vocabulary is
refused before any token.

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

from syntrop.runtimed import speculative as sp
from tests import tinymodel
from tests.models import require_llama, smollm2

require_llama()

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
    from llama_cpp import Llama

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
