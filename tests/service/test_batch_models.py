"""Continuous batching on real models: concurrent requests share decode
batches, requests join between steps, every sequence keeps its own sampler,
and (non-unified KV cache) each output equals the same request run alone,
bit for bit, on the tiny model and on SmolLM2. Sampling chains and logits
processors give what llama-cpp-python's `Llama.generate` gives; long
prompts are fed over several steps; callbacks, cancellation, decode
failures and the background driver thread."""

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from syntrop.runtimed.worker.batch import Batcher, DecodeError
from tests import tinymodel
from tests.models import require_llama, smollm2

require_llama()
#: llama.cpp runs in this process: in a child pytest of its own (tests/isolation.py).
pytestmark = pytest.mark.isolated

WORDS = ("boats", "trees", "linux", "coffee", "rain", "maps", "cats", "music")


def open_llama(path: Path) -> Any:
    from tests.models import Llama

    return Llama(model_path=str(path), n_ctx=256, n_threads=1, n_threads_batch=1, flash_attn=True,
                 verbose=False)


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
        settings: list[dict[str, Any]] = [
            {"temperature": 0.9, "seed": 11}, {"temperature": 0.0},
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
        with pytest.raises(ValueError, match="prompt of 64 tokens: 1 to 63"):
            batcher.submit([40] * 64, 4)
    finally:
        batcher.close()


def long_prompt(llama: Any, at_least: int) -> list[int]:
    """A chat prompt of at least `at_least` tokens (and not many more)."""
    for words in itertools.count(1):
        text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
        tokens = list(llama.tokenize(
            f"<|im_start|>user\nSay these words again: {text}.<|im_end|>\n"
            "<|im_start|>assistant\n".encode(), add_bos=True, special=True))
        if len(tokens) >= at_least:
            return tokens
    raise AssertionError("unreachable")


def eog_tokens(llama: Any) -> list[int]:
    import llama_cpp

    vocab = llama._model.vocab
    return [t for t in range(llama.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]


def reference(llama: Any, prompt: list[int], tokens: int, **settings: Any) -> list[int]:
    """llama-cpp-python's own generation from a fresh state, stopped at
    `tokens` tokens or end of generation."""
    import llama_cpp

    llama.reset()
    out = []
    for token in itertools.islice(llama.generate(prompt, **settings), tokens):
        if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
            break
        out.append(int(token))
    return out


def test_processor_changes_greedy_output_as_llama_generate_does(llama: Any) -> None:
    from llama_cpp import LogitsProcessorList

    prompt = prompts(llama, 1)[0]
    batcher = Batcher(llama, n_seq=2, n_ctx_seq=128, threads=1)
    try:
        plain = alone(batcher, prompt, 16)
        banned = plain[2]

        def make(seen: list[list[int]]) -> Any:
            def ban(input_ids: Any, scores: Any) -> Any:
                seen.append([int(t) for t in input_ids])
                scores = scores.copy()  # a new array: written back by the caller
                scores[banned] = -float("inf")
                return scores
            return ban

        ours: list[list[int]] = []
        request = batcher.submit(prompt, 16, processors=[make(ours)])
        other = batcher.submit(prompts(llama, 2)[1], 16)
        batcher.run()
    finally:
        batcher.close()
    theirs: list[list[int]] = []
    expected = reference(llama, prompt, 16, temp=0.0,
                         logits_processor=LogitsProcessorList([make(theirs)]))
    assert request.tokens == expected
    assert request.tokens[:2] == plain[:2] and request.tokens[2] != banned
    assert banned not in request.tokens
    assert other.tokens == alone_fresh(llama, prompts(llama, 2)[1], 16)
    # input_ids: the prompt, then one more sampled token per call.
    assert ours == theirs[:len(ours)]
    assert [len(ids) for ids in ours] == list(range(len(prompt), len(prompt) + len(ours)))
    assert ours[-1] == prompt + request.tokens[:-1]


def alone_fresh(llama: Any, prompt: list[int], tokens: int, n_batch: int = 512,
                **settings: Any) -> list[int]:
    batcher = Batcher(llama, n_seq=1, n_ctx_seq=256, n_batch=n_batch, threads=1)
    try:
        return alone(batcher, prompt, tokens, **settings)
    finally:
        batcher.close()


def test_seeded_sampling_chain_matches_llama_generate(llama: Any) -> None:
    prompt = prompts(llama, 1)[0]
    settings: dict[str, Any] = {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "min_p": 0.05}
    batcher = Batcher(llama, n_seq=3, n_ctx_seq=128, threads=1)
    try:
        runs = [batcher.submit(prompt, 24, seed=seed, **settings) for seed in (7, 7, 8)]
        batcher.run()
    finally:
        batcher.close()
    first, again, other = (r.tokens for r in runs)
    assert first == again
    assert first != other
    for seed, tokens in ((7, first), (8, other)):
        llama.set_seed(seed)
        assert tokens == reference(llama, prompt, 24, temp=0.9, top_k=40, top_p=0.9,
                                   min_p=0.05)


def test_prompt_longer_than_the_batch_is_fed_over_steps(llama: Any) -> None:
    long = long_prompt(llama, 150)
    short = prompts(llama, 2)
    solo = [alone_fresh(llama, p, 12, n_batch=32) for p in (long, *short)]
    if Path(llama.model_path).name == "tiny-F32.gguf":
        # In F32 the logits do not depend on how a prompt is split; with
        # SmolLM2's Q4_1 they change once a batch holds some 50 rows or
        # more (llama.cpp's CPU arithmetic), so there the reference is a
        # solo run in batches as small.
        assert solo[0] == alone_fresh(llama, long, 12, n_batch=512)
    batcher = Batcher(llama, n_seq=3, n_ctx_seq=256, n_batch=32, threads=1)
    try:
        first = batcher.submit(short[0], 12)
        while not first.tokens and not first.done:
            batcher.step()
        late = batcher.submit(long, 12)
        second = batcher.submit(short[1], 12)
        steps = 0
        while not late.tokens and not late.done:
            batcher.step()
            steps += 1
        # The long prompt (first come) takes the room the running request
        # leaves, which decodes one token a step meanwhile.
        assert steps == -(-len(long) // (32 - 1))
        assert len(first.tokens) == min(1 + steps, 12) or first.done
        batcher.run()
        # A prompt that fills the sequence but one token.
        full = batcher.submit(long_prompt(llama, 255)[:255], 12)
        batcher.run()
    finally:
        batcher.close()
    assert [late.tokens, first.tokens, second.tokens] == solo
    assert full.reason in ("length", "stop") and len(full.tokens) <= 1
    if full.tokens:
        assert full.reason == "length"


def test_sequence_full_and_max_tokens_finish_with_length(llama: Any) -> None:
    eog = eog_tokens(llama)

    def no_end(input_ids: Any, scores: Any) -> Any:
        scores[eog] = -float("inf")
        return scores

    long = long_prompt(llama, 40)
    batcher = Batcher(llama, n_seq=2, n_ctx_seq=len(long) + 5, threads=1)
    try:
        full = batcher.submit(long, 50, processors=[no_end])
        capped = batcher.submit(long[:20], 3, processors=[no_end])
        batcher.run()
        assert batcher.free_slots == 2
    finally:
        batcher.close()
    assert (full.reason, len(full.tokens)) == ("length", 5)
    assert (capped.reason, len(capped.tokens)) == ("length", 3)


def test_on_token_false_stops_and_raising_fails_only_its_request(llama: Any) -> None:
    texts = prompts(llama, 3)
    solo = [alone_fresh(llama, p, 12) for p in texts]
    seen: list[int] = []
    broken = RuntimeError("scanner failed")

    def stop_after_four(token: int, logits: Any) -> bool:
        seen.append(token)
        return len(seen) < 4

    def explode(token: int, logits: Any) -> bool:
        raise broken

    batcher = Batcher(llama, n_seq=3, n_ctx_seq=128, threads=1)
    try:
        stopped = batcher.submit(texts[0], 12, on_token=stop_after_four)
        failed = batcher.submit(texts[1], 12, on_token=explode)
        fine = batcher.submit(texts[2], 12)
        batcher.run()
        assert batcher.free_slots == 3
        again = batcher.submit(texts[1], 12)
        batcher.run()
    finally:
        batcher.close()
    if len(solo[0]) >= 4:
        assert (stopped.reason, stopped.tokens, seen) == ("stop", solo[0][:4], solo[0][:4])
    assert failed.reason == "error" and failed.error is broken
    assert failed.tokens == solo[1][:1]
    assert fine.tokens == solo[2] and fine.error is None
    assert again.tokens == solo[1]


def test_on_token_gets_the_raw_row_only_when_asked(llama: Any) -> None:
    """With logits, on_token sees the row as the model wrote it (before the
    processors' masks); without, None."""
    import numpy as np

    text = prompts(llama, 1)[0]
    eog = eog_tokens(llama)
    rows: list[tuple[int, Any]] = []
    plain: list[Any] = []

    def no_end(input_ids: Any, scores: Any) -> Any:
        scores[eog] = -float("inf")
        return scores

    def keep(token: int, logits: Any) -> bool:
        rows.append((token, logits.copy()))
        return True

    def record(token: int, logits: Any) -> bool:
        plain.append(logits)
        return True

    batcher = Batcher(llama, n_seq=2, n_ctx_seq=128, threads=1)
    try:
        asked = batcher.submit(text, 6, processors=[no_end], on_token=keep, logits=True)
        other = batcher.submit(text, 6, on_token=record)
        batcher.run()
    finally:
        batcher.close()
    assert plain == [None] * len(other.tokens)
    assert [t for t, _ in rows] == asked.tokens and len(rows) == 6
    for token, row in rows:
        assert row.shape == (int(llama.n_vocab()),) and np.isfinite(row[eog]).all()
        masked = row.copy()
        masked[eog] = -np.inf
        assert token == int(np.argmax(masked))  # greedy, after the mask


def test_cancel_from_another_thread(llama: Any) -> None:
    texts = prompts(llama, 2)
    solo = alone_fresh(llama, texts[1], 24)
    batcher = Batcher(llama, n_seq=2, n_ctx_seq=256, threads=1)
    started = threading.Event()
    try:
        queued = batcher.submit(texts[0], 8)
        queued.cancel()
        assert batcher.step() == 0 and queued.reason == "cancelled" and not queued.tokens
        assert batcher.free_slots == 2
        eog = eog_tokens(llama)

        def no_end(input_ids: Any, scores: Any) -> Any:
            scores[eog] = -float("inf")
            return scores

        def going(token: int, logits: Any) -> bool:
            started.set()
            return True

        def cancel() -> None:
            assert started.wait(60)
            endless.cancel()

        endless = batcher.submit(texts[0], 200, processors=[no_end], on_token=going)
        other = batcher.submit(texts[1], 24)
        canceller = threading.Thread(target=cancel)
        canceller.start()
        batcher.start()
        assert endless.wait(60) and other.wait(60)
        canceller.join()
    finally:
        batcher.close()
    assert endless.reason == "cancelled"
    assert 1 <= len(endless.tokens) < 200
    assert other.tokens == solo


def test_driver_thread_serves_concurrent_submitters(llama: Any) -> None:
    texts = prompts(llama, 6)
    solo = [alone_fresh(llama, p, 16) for p in texts]
    batcher = Batcher(llama, n_seq=4, n_ctx_seq=128, threads=1)
    results: dict[int, list[int]] = {}
    try:
        batcher.start()
        batcher.start()  # no second driver

        def client(i: int) -> None:
            request = batcher.submit(texts[i], 16)
            assert request.wait(120)
            results[i] = request.tokens

        clients = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        with pytest.raises(RuntimeError):
            batcher.step()
        assert not batcher.busy and batcher.running == 0 and batcher.free_slots == 4
        # Idle, then woken again by a submit (a short one: two threads on a
        # loaded machine are slow).
        batcher.set_threads(2)
        late = batcher.submit(texts[0], 3)
        assert late.wait(60)
        import llama_cpp

        assert llama_cpp.llama_n_threads(batcher._ctx) == 2
        pending = batcher.submit(long_prompt(llama, 60), 100)
    finally:
        batcher.close()
        batcher.close()
    assert [results[i] for i in range(6)] == solo
    assert late.tokens == solo[0][:3]
    assert pending.done and pending.reason in ("cancelled", "stop", "length")
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(texts[0], 4)


def test_decode_failure_fails_that_batch_only(llama: Any) -> None:
    texts = prompts(llama, 2)
    solo = alone_fresh(llama, texts[1], 8)
    batcher = Batcher(llama, n_seq=3, n_ctx_seq=128, threads=1)
    try:
        running = batcher.submit(texts[0], 8)
        batcher.step()
        bad = batcher.submit(texts[1], 8)
        bad.prompt[-1] = llama.n_vocab() + 10  # past submit's check: llama_decode refuses it
        batcher.step()
        assert bad.reason == running.reason == "error"
        assert isinstance(bad.error, DecodeError) and running.error is bad.error
        assert batcher.free_slots == 3
        after = batcher.submit(texts[1], 8)
        batcher.run()
    finally:
        batcher.close()
    assert after.tokens == solo


def test_bad_settings_are_refused(llama: Any) -> None:
    batcher = Batcher(llama, n_seq=2, n_ctx_seq=64, threads=1)
    prompt = prompts(llama, 1)[0][:10]
    try:
        with pytest.raises(ValueError, match="prompt tokens"):
            batcher.submit([llama.n_vocab()], 4)
        with pytest.raises(ValueError, match="max_tokens"):
            batcher.submit(prompt, 0)
        with pytest.raises(ValueError, match="top_p"):
            batcher.submit(prompt, 4, temperature=1.0, top_p=0.0)
        assert batcher.free_slots == 2 and not batcher.busy
    finally:
        batcher.close()
    with pytest.raises(ValueError, match="n_batch"):
        Batcher(llama, n_seq=8, n_batch=4)


def test_many_clients_submitting_and_cancelling_leave_no_sequence_behind(llama: Any) -> None:
    import random

    texts = prompts(llama, 8)
    batcher = Batcher(llama, n_seq=4, n_ctx_seq=128, n_batch=16, threads=1)
    requests: list[Any] = []

    def client(k: int) -> None:
        rng = random.Random(k)
        for _ in range(6):
            request = batcher.submit(texts[rng.randrange(8)], rng.randrange(1, 8),
                                     temperature=rng.choice([0.0, 0.8]), seed=k)
            requests.append(request)
            if rng.random() < 0.3:
                request.cancel()
            if rng.random() < 0.5:
                assert request.wait(120)

    try:
        batcher.start()
        clients = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        assert all(r.wait(120) for r in requests) and len(requests) == 48
        assert batcher.free_slots == 4 and batcher.running == 0 and not batcher.busy
    finally:
        batcher.close()
    assert {r.reason for r in requests} <= {"length", "stop", "cancelled"}
    assert all(len(r.tokens) <= r.max_tokens for r in requests)
