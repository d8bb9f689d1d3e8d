"""Token log-probabilities (logprobs.py and the pieces that carry them):
the numbers are log-softmax of the raw row, alternatives most likely first,
the entries ride with the tokens Output counts into each piece, pieces
joined into one reply join their entries, and the request's bounds are
checked before anything runs. Pure: a stand-in for the model's tokenizer."""

import asyncio
import math
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from syntrop.interfaces.runtime import InvalidSampling, Sampling, Speculative
from syntrop.runtimed import checks
from syntrop.runtimed.sampling import MAX_LOGPROBS, SamplingError, validate
from syntrop.runtimed.streams import relay
from syntrop.runtimed.supervisor import Call
from syntrop.runtimed.worker.engine import Output
from syntrop.runtimed.worker.logprobs import FLOOR, Scorer, score
from tests.unit.runtimed.test_stream import Worker, queued


def reference(row: list[float]) -> list[float]:
    peak = max(row)
    total = math.fsum(math.exp(x - peak) for x in row)
    return [x - peak - math.log(total) for x in row]


@given(st.lists(st.floats(-50, 50, width=32), min_size=1, max_size=300), st.data())
def test_score_is_log_softmax_and_top_is_sorted(row: list[float], data: st.DataObject) -> None:
    token = data.draw(st.integers(0, len(row) - 1))
    k = data.draw(st.integers(0, MAX_LOGPROBS))
    expected = reference(row)
    chosen, top = score(np.array(row, np.float32), token, k)
    assert chosen <= 0.0 and chosen == pytest.approx(expected[token], abs=1e-4)
    assert len(top) == min(k, len(row))
    values = [v for _, v in top]
    assert values == sorted(values, reverse=True)
    for i, value in top:
        assert value == pytest.approx(expected[i], abs=1e-4)
    if top:  # the most likely token leads (ties: lowest id)
        best = max(row)
        assert top[0][0] == row.index(best)
        # nothing left out is likelier than the last one kept
        kept = {i for i, _ in top}
        assert all(row[i] <= row[top[-1][0]] for i in range(len(row)) if i not in kept)


@given(st.lists(st.integers(-3, 3), min_size=1, max_size=3000), st.integers(1, MAX_LOGPROBS))
def test_top_is_exact_with_ties_over_blocks(values: list[int], k: int) -> None:
    row = np.array(values, np.float32)
    expected = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
    assert [i for i, _ in score(row, 0, k)[1]] == expected


def test_probabilities_sum_to_one_over_a_vocabulary() -> None:
    row = np.random.default_rng(1).normal(0, 4, 49152).astype(np.float32)
    _, top = score(row, 0, 20)
    assert [i for i, _ in top] == list(np.argsort(-row, kind="stable")[:20])
    total = sum(math.exp(score(row, i, 0)[0]) for i in range(0, 49152, 1))
    assert total == pytest.approx(1.0, abs=1e-3)


def test_minus_infinity_reads_as_the_floor() -> None:
    row = np.array([0.0, -np.inf, 1.0], np.float32)
    chosen, top = score(row, 1, 3)
    assert chosen == FLOOR and top[-1] == (1, FLOOR)
    assert all(math.isfinite(v) for _, v in top)
    assert score(np.full(3, -np.inf, np.float32), 0, 2) == (FLOOR, [(0, FLOOR), (1, FLOOR)])


PIECES = {0: b"He", 1: b"llo", 2: b" w", 3: b"orld", 4: b"\xe2\x82", 5: b"\xac", 6: b"!"}


class Llama:
    """The two things Output asks of llama-cpp-python's Llama."""

    def detokenize(self, tokens: list[int], special: bool = False) -> bytes:
        return b"".join(PIECES[t] for t in tokens)


def row_for(token: int) -> Any:
    row = np.zeros(len(PIECES), np.float32)
    row[token] = 3.0
    return row


def test_scorer_caches_pieces_and_keeps_invalid_utf8_in_bytes() -> None:
    asked: list[int] = []

    def piece(token: int) -> bytes:
        asked.append(token)
        return PIECES[token]

    scorer = Scorer(piece, 2)
    first = scorer.entry(row_for(4), 4)
    scorer.entry(row_for(4), 4)
    assert first["token"] == "\ufffd" and first["bytes"] == [0xE2, 0x82]
    assert first["top"][0]["bytes"] == [0xE2, 0x82]
    assert asked.count(4) == 1
    marker = scorer.entry(row_for(0), 0, b"")
    assert marker["token"] == "" and marker["bytes"] == [] and marker["top"][0]["token"] == "He"
    assert Scorer(piece, 0).entry(row_for(1), 1)["top"] == []


def run(tokens: list[int], stops: tuple[str, ...] = (), logprobs: int | None = 2,
        ) -> list[tuple[str, int, list[dict[str, Any]] | None]]:
    pieces: list[tuple[str, int, list[dict[str, Any]] | None]] = []

    def emit(text: str, tokens: int, logprobs: list[dict[str, Any]] | None = None) -> None:
        pieces.append((text, tokens, logprobs))

    output = Output(Llama(), emit, stops, logprobs=logprobs)
    for token in tokens:
        if not output.token(token, row_for(token) if output.scoring else None):
            break
    output.close()
    return pieces


def test_each_piece_carries_one_entry_per_token() -> None:
    pieces = run([0, 1, 2, 3, 4, 5, 6])
    assert "".join(t for t, _, _ in pieces) == "Hello world€!"
    for _, count, entries in pieces:
        assert entries is not None and len(entries) == count
    entries = [e for _, _, es in pieces for e in es or ()]
    assert bytes(b for e in entries for b in e["bytes"]).decode() == "Hello world€!"
    assert all(e["token"] == e["top"][0]["token"] for e in entries)


def test_a_stop_string_cuts_text_not_entries() -> None:
    pieces = run([0, 1, 2, 3, 6], stops=("lo w",))
    assert "".join(t for t, _, _ in pieces) == "Hel"
    assert sum(c for _, c, _ in pieces) == 3
    assert sum(len(es or ()) for _, _, es in pieces) == 3


def test_without_logprobs_nothing_is_scored() -> None:
    pieces = run([0, 1, 2], logprobs=None)
    assert all(entries is None for _, _, entries in pieces)


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1])
def test_logprobs_out_of_range_is_invalid_sampling(value: int) -> None:
    with pytest.raises(SamplingError) as caught:
        validate(n_ctx=64, logprobs=value)
    assert caught.value.parameter == "logprobs"
    wire = Sampling(max_tokens=None, temperature=None, top_p=None, top_k=None, seed=None,
                    stop=None, logprobs=value)
    with pytest.raises(InvalidSampling):
        checks.params(wire, 64)
    assert validate(n_ctx=64, logprobs=0).logprobs == 0
    assert validate(n_ctx=64).logprobs is None


def test_logprobs_with_speculative_decoding_is_refused() -> None:
    wire = Sampling(max_tokens=None, temperature=None, top_p=None, top_k=None, seed=None,
                    stop=None, logprobs=1, speculative=Speculative())
    with pytest.raises(InvalidSampling) as caught:
        checks.speculative(wire, checks.params(wire, 64), None)
    assert caught.value.parameters["parameter"] == "logprobs"


def entry(token: str) -> dict[str, Any]:
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()),
            "top": [{"token": token, "logprob": -0.5, "bytes": list(token.encode())}]}


def test_joined_pieces_join_their_entries_and_the_last_chunk_has_none() -> None:
    async def main() -> list[Any]:
        call = Call(1, "generate", "Complete")
        queued(call, *(("piece", {"text": t, "tokens": 1, "logprobs": [entry(t)]})
                       for t in ("a", "b", "c")),
               ("done", {"result": {"reason": "length"}}))
        return [reply.parameters["chunk"] async for reply in relay(
            Worker(), call, done=lambda: None, received=time.monotonic())]  # type: ignore[arg-type]

    chunks = asyncio.run(main())
    assert chunks[0].text == "abc" and chunks[0].tokens == 3
    assert [lp.token for lp in chunks[0].logprobs] == ["a", "b", "c"]
    assert chunks[0].logprobs[1].top[0].bytes == [ord("b")]
    assert chunks[-1].finish_reason == "length" and chunks[-1].logprobs is None
