"""The per-unit circuit breaker: pure functions of a state, a policy and
the current time (microseconds, from an injected clock).

The shape follows systemd's RestartSteps= / RestartMaxDelaySec= and
Kubernetes' CrashLoopBackOff: after the n-th remediation attempt in a window
the next one waits base * factor**(n-1), capped at max_delay. A window
(cooldown) of quiet resets the count. When `cap` attempts have been made in
one window the breaker marks the unit needs_human and lets nothing through
until somebody resets it: sentry never restarts a unit indefinitely.

States, as the contract names them:
    closed       no attempt is waiting on a backoff delay;
    open         an attempt was made and the backoff delay has not passed;
    needs_human  the cap was reached; only ResetBreaker closes it.
"""

from dataclasses import dataclass, replace

SECOND = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """How patient the breaker is.

    window_usec: attempts older than this (since the window's first attempt)
        no longer count.
    cap: attempts per window; the next failure after the cap needs a human.
    base_usec, factor, max_usec: the backoff after each attempt.
    """

    window_usec: int = 600 * SECOND
    cap: int = 3
    base_usec: int = 10 * SECOND
    factor: float = 2.0
    max_usec: int = 300 * SECOND

    def __post_init__(self) -> None:
        if self.cap < 1 or self.window_usec <= 0 or self.base_usec < 0:
            raise ValueError("breaker policy: cap >= 1, window > 0, base >= 0")
        if self.factor < 1 or self.max_usec < self.base_usec:
            raise ValueError("breaker policy: factor >= 1, max >= base")

    def delay(self, attempts: int) -> int:
        """The wait after the attempts-th attempt of a window (1-based)."""
        if attempts <= 0:
            return 0
        return int(min(self.base_usec * self.factor ** (attempts - 1), self.max_usec))


@dataclass(frozen=True, slots=True, kw_only=True)
class State:
    """What is persisted per unit."""

    unit: str
    attempts: int = 0
    window_start_usec: int = 0
    last_attempt_usec: int = 0
    needs_human: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Whether an attempt may be made now, and if not, until when.
    open_until_usec is 0 when only a human can close the breaker."""

    allowed: bool
    state: str
    open_until_usec: int


def _current(state: State, now_usec: int, policy: Policy) -> State:
    """The state with an expired window forgotten."""
    if (not state.needs_human and state.attempts
            and now_usec - state.window_start_usec >= policy.window_usec):
        return replace(state, attempts=0, window_start_usec=0)
    return state


def check(state: State, now_usec: int, policy: Policy) -> Verdict:
    """May a remediation attempt for this unit be made at now_usec?"""
    state = _current(state, now_usec, policy)
    if state.needs_human:
        return Verdict(allowed=False, state="needs_human", open_until_usec=0)
    if state.attempts >= policy.cap:
        return Verdict(allowed=False, state="needs_human", open_until_usec=0)
    if state.attempts:
        until = state.last_attempt_usec + policy.delay(state.attempts)
        if now_usec < until:
            return Verdict(allowed=False, state="open", open_until_usec=until)
    return Verdict(allowed=True, state="closed", open_until_usec=0)


def attempts_in_window(state: State, now_usec: int, policy: Policy) -> int:
    """Remediation attempts of the current window (an expired one: 0)."""
    return _current(state, now_usec, policy).attempts


def record_attempt(state: State, now_usec: int, policy: Policy) -> State:
    """The state after an attempt made at now_usec."""
    state = _current(state, now_usec, policy)
    attempts = state.attempts + 1
    return replace(
        state,
        attempts=attempts,
        window_start_usec=state.window_start_usec if state.attempts else now_usec,
        last_attempt_usec=now_usec,
    )


def record_refused(state: State, now_usec: int, policy: Policy) -> State:
    """The state after a failure the breaker refused: a unit that fails
    again once the cap is spent is marked for a human, for good."""
    state = _current(state, now_usec, policy)
    if state.attempts >= policy.cap:
        return replace(state, needs_human=True)
    return state


def record_out_of_reach(state: State) -> State:
    """A cause no tool can remove was named and what was due (at most one
    restart) did not heal it: only a human can, so the cap is not spent."""
    return replace(state, needs_human=True)


def describe(state: State, now_usec: int, policy: Policy) -> str:
    """closed, open or needs_human, as the contract names them."""
    return check(state, now_usec, policy).state


def reset(unit: str) -> State:
    return State(unit=unit)
