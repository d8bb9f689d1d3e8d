"""Continuous batching on real models: concurrent requests share decode
batches, requests join between steps, every sequence keeps its own sampler,
and (non-unified KV cache) each output equals the same request run alone,
bit for bit, on the tiny model and on SmolLM2."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from syntrop.runtimed.batch import Batcher
from tests import tinymodel
from tests.models import require_llama, smollm2

require_llama()

WORDS = ("boats", "trees", "linux", "coffee", "rain", "maps", "cats", "music")


def open_llama(path: Path) -> Any:
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def llama(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    model = open_llama(tinymodel.build(tmp_path_factory, "F32") if request.param == "tiny"
                       else smollm2())
    yield model
    model.close()


def prompts(llama: Any, count: int) -> list[list[int]]:
    return [list(llama.tokenize(
        f"<|im_start|>user\nWrite about {WORDS[i % len(WORDS)]}.<|im_end|>\n"
        "<|im_start|>assistant\n".encode(), add_bos=True, special=True))
        for i in range(count)]


def alone(batcher: Batcher, prompt: list[int], tokens: int, **sampling: Any) -> list[int]:
    request = batcher.submit(prompt, tokens, **sampling)
    batcher.run()
    return request.tokens


def test_concurrent_requests_share_steps_and_match_solo_runs(llama: Any) -> None:
    batcher = Batcher(llama, n_seq=4, n_ctx_seq=128, threads=1)
    try:
        texts = prompts(llama, 4)
        solo = [alone(batcher, p, 24) for p in texts]
        solo_steps = 0
        requests = [batcher.submit(p, 24) for p in texts]
        while batcher.busy:
            batcher.step()
            solo_steps += 1
    finally:
        batcher.close()
    assert [r.tokens for r in requests] == solo
    assert all(r.done for r in requests)
    # Four requests of up to 24 tokens each took about 24 shared steps.
    assert solo_steps <= 25


def test_requests_join_between_steps_with_their_own_samplers(llama: Any) -> None:
    batcher = Batcher(llama, n_seq=4, n_ctx_seq=128, threads=1)
    try:
        texts = prompts(llama, 4)
        texts[3] = texts[0]  # the same prompt under another seed
        settings = [{"temperature": 0.9, "seed": 11}, {"temperature": 0.0},
                    {"temperature": 1.2, "seed": 5}, {"temperature": 0.9, "seed": 12}]
        solo = [alone(batcher, p, 16, **s) for p, s in zip(texts, settings, strict=True)]
        assert batcher.free_slots == 4
        first = [batcher.submit(texts[i], 16, **settings[i]) for i in (0, 1)]
        for _ in range(5):
            batcher.step()
        assert batcher.free_slots == 2
        late = [batcher.submit(texts[i], 16, **settings[i]) for i in (2, 3)]
        assert batcher.free_slots == 0
        batcher.run()
        assert batcher.free_slots == 4
    finally:
        batcher.close()
    assert [r.tokens for r in first + late] == solo
    # Same prompt, other seed: the samplers are independent.
    assert solo[0] != solo[3]


def test_bad_prompts_are_refused(llama: Any) -> None:
    batcher = Batcher(llama, n_seq=2, n_ctx_seq=64, threads=1)
    try:
        with pytest.raises(ValueError, match="prompt of 0 tokens"):
            batcher.submit([], 4)
        with pytest.raises(ValueError, match="prompt of 70 tokens"):
            batcher.submit([40] * 70, 4)
    finally:
        batcher.close()
