"""The sampling math of speculative decoding (pure numpy): the target's
distribution after llama.cpp's chain, and the accept/residual step whose
emitted tokens must follow that distribution exactly."""

import math

import numpy as np
import pytest

from syntrop.runtimed.worker.speculative import (
    Sampler,
    candidates,
    common_prefix,
    distribution,
    draw,
    sample,
    verify,
)

TRIALS = 20_000
#: Logits of a small vocabulary: probabilities spread from likely to rare.
LOGITS = np.log(np.array([0.02, 0.30, 0.05, 0.18, 0.01, 0.25, 0.12, 0.07], dtype=np.float32))


def reference(logits: np.ndarray, sampler: Sampler) -> np.ndarray:
    """llama.cpp's chain written out one candidate list at a time."""
    x = [float(v) for v in logits]
    out = np.zeros(len(x))
    if sampler.temperature <= 0:
        out[max(range(len(x)), key=lambda i: (x[i], -i))] = 1.0
        return out
    cur = sorted(range(len(x)), key=lambda i: (-x[i], i))
    if 0 < sampler.top_k < len(cur):
        cur = cur[:sampler.top_k]
    if sampler.top_p < 1.0:
        total = sum(math.exp(x[i] - x[cur[0]]) for i in cur)
        cumulative, kept = 0.0, []
        for i in cur:
            kept.append(i)
            cumulative += math.exp(x[i] - x[cur[0]]) / total
            if cumulative >= sampler.top_p:
                break
        cur = kept
    if sampler.min_p > 0.0:
        cur = [cur[0]] + [i for i in cur[1:] if x[i] >= x[cur[0]] + math.log(sampler.min_p)]
    weights = {i: math.exp(x[i] / sampler.temperature) for i in cur}
    total = sum(weights.values())
    for i, w in weights.items():
        out[i] = w / total
    return out


def chi_square_bound(df: int) -> float:
    """Upper 1e-4 quantile of chi-square with `df` degrees of freedom
    (Wilson-Hilferty); a correct sampler exceeds it once in 10000 runs."""
    z = 3.719
    return float(df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3)


def assert_follows(samples: list[int], p: np.ndarray) -> None:
    """`samples` come from `p`: none outside its support, chi-square within
    the bound over the support."""
    counts = np.bincount(samples, minlength=p.size)
    assert not counts[p == 0].any(), "sampled a token of probability 0"
    support = np.flatnonzero(p)
    expected = p[support] * len(samples)
    statistic = float(((counts[support] - expected) ** 2 / expected).sum())
    assert statistic < chi_square_bound(support.size - 1), (counts, expected)


def test_distribution_of_known_values() -> None:
    logits = np.log([1.0, 2.0, 3.0, 4.0])
    base = Sampler(temperature=1.0, top_k=0)
    np.testing.assert_allclose(distribution(logits, base), [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(
        distribution(logits, Sampler(temperature=0.5, top_k=0)),
        np.array([1.0, 4.0, 9.0, 16.0]) / 30)
    np.testing.assert_allclose(distribution(logits, Sampler(temperature=1.0, top_k=2)),
                               [0, 0, 3 / 7, 4 / 7])
    # top_p: the smallest set reaching p (0.4 + 0.3 >= 0.5), before temperature.
    np.testing.assert_allclose(
        distribution(logits, Sampler(temperature=0.5, top_k=0, top_p=0.5)),
        [0, 0, 9 / 25, 16 / 25])
    # min_p relative to the top probability: 0.45 * 0.4 = 0.18 drops only 0.1.
    np.testing.assert_allclose(
        distribution(logits, Sampler(temperature=1.0, top_k=0, min_p=0.45)),
        [0, 2 / 9, 3 / 9, 4 / 9])
    np.testing.assert_allclose(
        distribution(logits, Sampler(temperature=1.0, top_k=0, min_p=0.6)),
        [0, 0, 3 / 7, 4 / 7])


def test_filters_keep_at_least_the_top_token() -> None:
    logits = np.log([1.0, 2.0, 3.0, 4.0])
    for sampler in (Sampler(temperature=1.0, min_p=1.0), Sampler(temperature=1.0, top_p=0.01),
                    Sampler(temperature=1.0, top_k=1)):
        np.testing.assert_array_equal(distribution(logits, sampler), [0, 0, 0, 1])


def test_top_k_zero_or_past_the_vocabulary_keeps_everything() -> None:
    for k in (0, -1, 4, 100):
        np.testing.assert_allclose(
            distribution(np.log([1.0, 2.0, 3.0, 4.0]), Sampler(temperature=1.0, top_k=k)),
            [0.1, 0.2, 0.3, 0.4])


def test_ties_at_the_top_k_cut_go_to_the_lower_id() -> None:
    logits = np.array([1.0, 2.0, 1.0, 1.0, 0.0])
    assert list(candidates(logits, Sampler(temperature=1.0, top_k=3))) == [0, 1, 2]


def test_greedy_is_the_argmax() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        logits = rng.normal(size=64).astype(np.float32)
        p = distribution(logits, Sampler())
        assert p[int(np.argmax(logits))] == 1.0 and p.sum() == 1.0
    # A tie goes to the first, as llama.cpp's greedy sampler does.
    assert distribution(np.array([0.0, 5.0, 5.0]), Sampler(temperature=0.0))[1] == 1.0
    assert Sampler().greedy and Sampler(temperature=-1.0).greedy
    assert not Sampler(temperature=0.8).greedy


@pytest.mark.parametrize("sampler", [
    Sampler(temperature=0.8),
    Sampler(temperature=0.8, top_k=0),
    Sampler(temperature=1.3, top_k=10, top_p=0.9),
    Sampler(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
    Sampler(temperature=2.0, top_k=0, top_p=0.5),
    Sampler(temperature=0.5, top_k=0, min_p=0.2),
    Sampler(temperature=1.0, top_k=5, min_p=0.5, top_p=0.8),
])
def test_distribution_matches_a_direct_computation(sampler: Sampler) -> None:
    rng = np.random.default_rng(11)
    for _ in range(40):
        logits = (rng.normal(size=300) * rng.uniform(0.5, 4.0)).astype(np.float32)
        p = distribution(logits, sampler)
        assert p.dtype == np.float64
        assert p.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(p, reference(logits, sampler), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("sampler", [
    Sampler(temperature=0.8, top_k=0, top_p=0.9),
    Sampler(temperature=0.8, top_k=0, top_p=0.9, min_p=0.01),
    Sampler(temperature=1.0, top_k=0, min_p=0.02),
    Sampler(temperature=1.0, top_k=2000, top_p=0.95),
])
@pytest.mark.parametrize("peak", [0.0, 12.0])
def test_distribution_over_a_large_vocabulary(sampler: Sampler, peak: float) -> None:
    """Past 1024 candidates top_p looks at the 256 most likely first; a
    peaked row (the usual case) is decided there, a flat one is sorted."""
    rng = np.random.default_rng(5)
    logits = (rng.normal(size=6000) * 2).astype(np.float32)
    logits[rng.choice(6000, 20, replace=False)] += peak
    np.testing.assert_allclose(distribution(logits, sampler), reference(logits, sampler),
                               rtol=1e-9, atol=1e-15)


def test_sample_is_draw_of_the_distribution() -> None:
    rng = np.random.default_rng(8)
    for sampler in (Sampler(temperature=0.8), Sampler(temperature=1.5, top_k=0, top_p=0.9),
                    Sampler(temperature=0.6, top_k=100, min_p=0.1)):
        logits = (rng.normal(size=2000) * 3).astype(np.float32)
        p = distribution(logits, sampler)
        one, two = np.random.default_rng(sampler.top_k), np.random.default_rng(sampler.top_k)
        assert [sample(logits, sampler, one) for _ in range(300)] == \
            [draw(p, two) for _ in range(300)]
    # Greedy draws nothing.
    untouched = np.random.default_rng(1)
    assert sample(np.array([0.0, 3.0, 1.0]), Sampler(), untouched) == 1
    assert untouched.random() == np.random.default_rng(1).random()


def test_draw_follows_the_distribution() -> None:
    p = distribution(LOGITS, Sampler(temperature=1.0, top_k=0))
    rng = np.random.default_rng(1)
    assert_follows([draw(p, rng) for _ in range(TRIALS)], p)


@pytest.mark.parametrize(("draft", "sampler"), [
    (1, Sampler(temperature=1.0, top_k=0)),        # likely (0.30)
    (4, Sampler(temperature=1.0, top_k=0)),        # unlikely (0.01)
    (3, Sampler(temperature=0.8, top_k=4)),        # top_k cuts the support
    (6, Sampler(temperature=1.2, top_k=0, top_p=0.8)),
    (3, Sampler(temperature=1.0, top_k=0, min_p=0.3)),
    (0, Sampler(temperature=1.0, top_k=3)),        # a draft outside the support
])
def test_accept_and_residual_give_the_target_distribution(draft: int, sampler: Sampler) -> None:
    p = distribution(LOGITS, sampler)
    rng = np.random.default_rng(sampler.seed + draft)
    outcomes = [verify(p, draft, rng) for _ in range(TRIALS)]
    tokens = [token for _, token in outcomes]
    # Everything emitted at this position follows p...
    assert_follows(tokens, p)
    # ... the draft is accepted with probability p(draft), exactly when emitted ...
    accepted = sum(ok for ok, _ in outcomes)
    assert all(ok == (token == draft) for ok, token in outcomes)
    sigma = math.sqrt(TRIALS * p[draft] * (1 - p[draft])) or 1.0
    assert abs(accepted - TRIALS * p[draft]) < 4.5 * sigma
    # ... and on rejection the token follows p without the draft, renormalised.
    residual = p.copy()
    residual[draft] = 0.0
    residual /= residual.sum()
    assert_follows([token for ok, token in outcomes if not ok], residual)


def test_the_target_token_does_not_depend_on_the_draft() -> None:
    """One uniform per position, whatever was drafted: the same seed gives
    the same tokens with any drafter."""
    p = distribution(LOGITS, Sampler(temperature=1.0, top_k=0))
    runs = []
    for draft in (1, 4, 7):
        rng = np.random.default_rng(42)
        runs.append([verify(p, draft, rng)[1] for _ in range(200)])
    assert runs[0] == runs[1] == runs[2]
    other = np.random.default_rng(43)
    assert runs[0] != [verify(p, 1, other)[1] for _ in range(200)]


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix(np.array([1, 2, 3], dtype=np.intc), [1, 2, 3]) == 3
    assert common_prefix([], [1]) == 0
    assert common_prefix([9], [1]) == 0
