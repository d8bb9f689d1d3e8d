"""Sampling parameters: validation, defaults, and stop-sequence scanning.

Pure: no engine, no Varlink. The service turns the wire's `Sampling` into a
`Params` with `validate`, which raises `SamplingError` naming the parameter.
"""

import os
from dataclasses import dataclass

MAX_STOPS = 8
MAX_STOP_LENGTH = 256
MAX_TEMPERATURE = 10.0
#: llama.cpp reads 2^32 - 1 as "choose a random seed": the largest one that repeats.
MAX_SEED = (1 << 32) - 2

DEFAULT_MAX_TOKENS = 256
#: llama.cpp's own default min-p filter (llama-cpp-python's too).
DEFAULT_MIN_P = 0.05
#: Most alternatives a token's logprobs list (OpenAI's top_logprobs bound).
MAX_LOGPROBS = 20


def _random_seed() -> int:
    """A seed from the kernel's random source, as secrets.randbelow would
    draw it (whose import maps libcrypto): 64 random bits folded into the
    seed's range, a bias below one part in 2**32."""
    return int.from_bytes(os.urandom(8), "little") % MAX_SEED


class SamplingError(ValueError):
    """A sampling value is out of range."""

    def __init__(self, parameter: str, reason: str) -> None:
        super().__init__(f"{parameter}: {reason}")
        self.parameter = parameter
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    """Validated sampling parameters; `seed` is always set."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    seed: int = 0
    stop: tuple[str, ...] = ()
    min_p: float = DEFAULT_MIN_P
    #: Most thinking tokens; None for no budget.
    reasoning_budget: int | None = None
    #: Log-probabilities of each token and this many alternatives; None for none.
    logprobs: int | None = None


def validate(
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: list[str] | None = None,
    min_p: float | None = None,
    reasoning_budget: int | None = None,
    logprobs: int | None = None,
    n_ctx: int,
) -> Params:
    """Check each value against its range; fill defaults (a random seed when
    none is given, so only an explicit seed repeats)."""
    if max_tokens is not None and not 1 <= max_tokens <= n_ctx:
        raise SamplingError("max_tokens", f"1 to {n_ctx}")
    if temperature is not None and not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise SamplingError("temperature", f"0 to {MAX_TEMPERATURE:g}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise SamplingError("top_p", "greater than 0, at most 1")
    if top_k is not None and top_k < 0:
        raise SamplingError("top_k", "0 (all) or more")
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise SamplingError("min_p", "0 to 1")
    if reasoning_budget is not None and not 0 <= reasoning_budget < n_ctx:
        raise SamplingError("reasoning_budget", f"0 to {n_ctx - 1}")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise SamplingError("logprobs", f"0 to {MAX_LOGPROBS}")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise SamplingError("seed", f"0 to {MAX_SEED}")
    stops = tuple(stop or ())
    if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_LENGTH for s in stops):
        raise SamplingError("stop", f"at most {MAX_STOPS} non-empty strings of "
                            f"at most {MAX_STOP_LENGTH} characters")
    defaults = Params()
    return Params(
        max_tokens=max_tokens if max_tokens is not None else min(defaults.max_tokens, n_ctx),
        temperature=temperature if temperature is not None else defaults.temperature,
        top_p=top_p if top_p is not None else defaults.top_p,
        top_k=top_k if top_k is not None else defaults.top_k,
        seed=seed if seed is not None else _random_seed(),
        stop=stops,
        min_p=min_p if min_p is not None else defaults.min_p,
        reasoning_budget=reasoning_budget,
        logprobs=logprobs,
    )


class StopScanner:
    """Finds stop sequences in streamed text. Text that could still be the
    start of a stop sequence is held back until the next piece decides it,
    so a stop sequence never reaches the client."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """The text safe to emit now, and whether a stop sequence ended it."""
        buffer = self._held + text
        cut = min((i for i in (buffer.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buffer[:cut], True
        keep = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), 0, -1):
                if buffer.endswith(stop[:length]):
                    keep = max(keep, length)
                    break
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """What is still held back, at the end of generation."""
        held, self._held = self._held, ""
        return held
