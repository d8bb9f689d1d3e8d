"""Chat prefix digests: equal turns give equal digests, and a conversation's
digests continue the chain of its start."""

from hypothesis import given
from hypothesis import strategies as st

from syntrop.prefix import REPORT_FIRST, REPORT_LAST, chain, matched, reported

turns = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text()),
                 max_size=8)


@given(turns, turns)
def test_a_conversation_extends_the_chain_of_its_start(start: list[tuple[str, str]],
                                                       more: list[tuple[str, str]]) -> None:
    assert chain(start + more)[:len(start)] == chain(start)


def test_a_digest_covers_role_and_text_and_their_boundary() -> None:
    first = chain([("user", "ab")])[0][0]
    assert first != chain([("system", "ab")])[0][0]
    assert chain([("user", "a"), ("user", "b")])[1][0] != chain([("user", "ab")])[0][0]
    assert chain([("user", "ab"), ("user", "")])[0][0] == first


def test_the_longest_resident_prefix_is_matched() -> None:
    request = chain([("system", "rules " * 100), ("user", "first"), ("assistant", "yes"),
                     ("user", "second")])
    assert matched(request, set()) == 0
    assert matched(request, {request[0][0]}) == 600
    assert matched(request, {request[0][0], request[2][0]}) == 600 + 5 + 3
    assert matched(request, {"0" * 16}) == 0


def test_a_long_chat_reports_its_first_and_last_digests() -> None:
    long = [("user", str(i)) for i in range(40)]
    digests = [d for d, _ in chain(long)]
    assert reported(long) == tuple(digests[:REPORT_FIRST] + digests[-REPORT_LAST:])
    assert reported(long[:3]) == tuple(digests[:3])
