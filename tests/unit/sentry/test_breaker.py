import pytest

from syntrop.sentry import breaker
from syntrop.sentry.breaker import SECOND, Policy, State

POLICY = Policy(window_usec=600 * SECOND, cap=3, base_usec=10 * SECOND, factor=2.0,
                max_usec=15 * SECOND)
T0 = 1_000_000 * SECOND


def test_breaker_closed_allows_first_attempt() -> None:
    verdict = breaker.check(State(unit="a.service"), T0, POLICY)
    assert verdict.allowed and verdict.state == "closed"


def test_breaker_backoff_grows_and_is_capped() -> None:
    assert [POLICY.delay(n) for n in (0, 1, 2, 3, 4)] == [
        0, 10 * SECOND, 15 * SECOND, 15 * SECOND, 15 * SECOND]


def test_breaker_open_until_backoff_passes() -> None:
    state = breaker.record_attempt(State(unit="a.service"), T0, POLICY)
    verdict = breaker.check(state, T0 + 5 * SECOND, POLICY)
    assert not verdict.allowed and verdict.state == "open"
    assert verdict.open_until_usec == T0 + 10 * SECOND
    assert breaker.check(state, T0 + 10 * SECOND, POLICY).allowed


def test_breaker_cap_needs_human_and_never_reopens_by_itself() -> None:
    state = State(unit="a.service")
    now = T0
    for _ in range(POLICY.cap):
        assert breaker.check(state, now, POLICY).allowed
        state = breaker.record_attempt(state, now, POLICY)
        now += 20 * SECOND
    verdict = breaker.check(state, now, POLICY)
    assert verdict == breaker.Verdict(allowed=False, state="needs_human", open_until_usec=0)
    state = breaker.record_refused(state, now, POLICY)
    assert state.needs_human
    # even after the window, only a reset closes it
    assert not breaker.check(state, now + 10 * POLICY.window_usec, POLICY).allowed
    assert breaker.check(breaker.reset("a.service"), now, POLICY).allowed


def test_breaker_quiet_window_forgets_attempts() -> None:
    state = breaker.record_attempt(State(unit="a.service"), T0, POLICY)
    state = breaker.record_attempt(state, T0 + 20 * SECOND, POLICY)
    later = T0 + POLICY.window_usec
    assert breaker.check(state, later, POLICY).allowed
    assert breaker.record_attempt(state, later, POLICY).attempts == 1


def test_breaker_never_allows_more_than_cap_per_window() -> None:
    state = State(unit="a.service")
    allowed = 0
    for second in range(0, 600, 1):
        now = T0 + second * SECOND
        if breaker.check(state, now, POLICY).allowed:
            allowed += 1
            state = breaker.record_attempt(state, now, POLICY)
        else:
            state = breaker.record_refused(state, now, POLICY)
    assert allowed == POLICY.cap


@pytest.mark.parametrize("kwargs", [{"cap": 0}, {"window_usec": 0}, {"factor": 0.5},
                                    {"base_usec": 10, "max_usec": 5}])
def test_breaker_policy_rejects_nonsense(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Policy(**kwargs)
