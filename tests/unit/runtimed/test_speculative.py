"""Prompt-lookup drafting and output comparison, on plain token lists."""

from syntrop.runtimed.worker.speculative import PromptLookup, Result, divergence, lookup


def test_lookup_proposes_what_followed_the_last_ngram() -> None:
    context = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    assert lookup(context, 2) == [4, 5]
    assert lookup(context, 10) == [4, 5, 9, 9, 2, 3]


def test_lookup_prefers_the_longest_ngram() -> None:
    # "3" alone last occurred before 7; "2 3" only before 4.
    context = [2, 3, 4, 8, 3, 7, 2, 3]
    assert lookup(context, 1, ngram_max=2) == [4]
    assert lookup(context, 1, ngram_max=1) == [7]


def test_lookup_takes_the_most_recent_match() -> None:
    assert lookup([5, 1, 5, 2, 5], 1) == [2]


def test_lookup_without_a_match_or_room_proposes_nothing() -> None:
    assert lookup([1, 2, 3], 4) == []
    assert lookup([1, 2, 1], 0) == []
    assert lookup([], 3) == []
    assert lookup([7], 3) == []
    assert lookup([1, 2, 3, 1, 2], 4, ngram_min=3) == []


def test_lookup_never_matches_the_tail_with_itself() -> None:
    # The only occurrence of [4, 4] ending before the tail starts at 0.
    assert lookup([4, 4, 4], 2, ngram_max=2) == [4]


def test_prompt_lookup_drafter_uses_its_ngram_range() -> None:
    assert PromptLookup(ngram_max=2, ngram_min=2).propose([2, 3, 4, 8, 3, 7, 2, 3], 3) == [4, 8, 3]


def test_divergence() -> None:
    assert divergence([1, 2, 3], [1, 2, 3]) is None
    assert divergence([1, 2, 3], [1, 5, 3]) == 1
    assert divergence([1, 2, 3], [1, 2]) == 2


def test_acceptance_rate() -> None:
    assert Result(tokens=[], reason="stop").acceptance == 0.0
    assert Result(tokens=[], reason="stop", drafted=8, accepted=6).acceptance == 0.75
