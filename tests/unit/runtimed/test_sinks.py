"""Attention-sink window arithmetic and the bounded journal (no model)."""

import pytest

from syntrop.runtimed.journal import Journal
from syntrop.runtimed.worker.sinks import Shift, apply, default_discard, plan


def test_no_shift_while_the_tokens_fit() -> None:
    assert plan(0, 16, 16, 4, 6) is None
    assert plan(15, 1, 16, 4, 6) is None


def test_shift_drops_tokens_after_the_sinks() -> None:
    shift = plan(16, 1, 16, 4, 6)
    assert shift == Shift(start=4, count=6, end=16)
    window = list(range(16))
    after = apply(window, shift)
    assert after == [0, 1, 2, 3, *range(10, 16)]
    assert len(after) + 1 <= 16


def test_large_input_takes_several_discards() -> None:
    shift = plan(14, 5, 16, 2, 2)
    assert shift is not None and shift.count == 4  # 14 + 5 - 16 = 3, rounded up
    assert len(apply(list(range(14)), shift)) + 5 <= 16


def test_impossible_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        plan(8, 13, 16, 4, 6)
    with pytest.raises(ValueError):
        plan(0, 1, 16, 4, 0)


def test_default_discard_is_half_the_window() -> None:
    assert default_discard(512, 4) == 254
    assert default_discard(5, 4) == 1


def test_stream_never_outgrows_the_context() -> None:
    n_ctx, sinks, discard = 32, 4, 7
    window: list[int] = []
    for token in range(1000):
        shift = plan(len(window), 1, n_ctx, sinks, discard)
        if shift is not None:
            window = apply(window, shift)
        window.append(token)
        assert len(window) <= n_ctx
        assert window[:sinks] == list(range(min(sinks, token + 1)))
    assert window[-1] == 999


def test_journal_keeps_the_last_bytes() -> None:
    journal = Journal(10)
    for piece in ("hello ", "world ", "again"):
        journal.append(piece)
    assert journal.text() == "orld again"
    assert journal.total == 17 and journal.dropped == 7 and len(journal) == 10


def test_journal_cuts_at_a_character_boundary() -> None:
    journal = Journal(5)
    journal.append("ab")
    journal.append("éé")
    journal.append("xy")  # 8 bytes: cutting 3 would split the first é
    assert journal.text() == "éxy"
    assert len(journal) == 4
    journal.append("x" * 100)
    assert journal.text() == "xxxxx"


def test_journal_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Journal(0)
