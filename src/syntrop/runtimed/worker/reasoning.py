"""Reasoning budgets: a limit on thinking tokens, enforced while decoding.

Reasoning models think between a start and an end marker (`<think>` and
`</think>`, each one token) and answer after the end marker. `Reasoning` is
both a logits processor for llama-cpp-python's `Llama.generate` and the
filter of the token stream it produces:

- It follows the state, thinking or answering, from the tokens: the prompt
  (a chat template that ends in `<think>` starts the output thinking) and
  every generated token.
- It counts thinking tokens (markers excluded). When the count reaches the
  budget, every logit but the end marker's is masked (-inf), so the next
  token closes the thinking and decoding continues with the answer.
- Once answering, both markers are masked: the answer never holds them, nor
  re-opens thinking. While thinking, end-of-generation tokens are masked
  (when given): every generation that thinks also answers.
- `feed(token)` classifies each generated token for the caller: THINKING,
  ANSWER or MARKER; only ANSWER tokens belong in the answer text, and the
  counts (`thinking_tokens`, `answer_tokens`) are reported apart.

Logits processors are called before each token is sampled, with every token
of the context; the caller's `feed` runs between samples. Either may see a
token first: tokens are counted once, by position.
"""

from collections.abc import Sequence
from typing import Any

THINKING = "thinking"
ANSWER = "answer"
MARKER = "marker"

START_MARKER = "<think>"
END_MARKER = "</think>"


class ReasoningError(Exception):
    """The model has no single-token thinking markers."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def markers(llama: Any, start: str = START_MARKER, end: str = END_MARKER) -> tuple[int, int]:
    """Token ids of a loaded model's start and end of thinking markers."""
    found = []
    for text in (start, end):
        tokens = llama.tokenize(text.encode(), add_bos=False, special=True)
        if len(tokens) != 1:
            raise ReasoningError(f"the model has no single token for {text}")
        found.append(int(tokens[0]))
    return found[0], found[1]


class Reasoning:
    """A thinking budget for one generation.

    start, end: the marker token ids.
    budget: most thinking tokens; None for no limit (markers are still
        filtered out of the answer).
    thinking: whether the output begins inside thinking; None to decide from
        the prompt (its last marker) on the first call.
    eog: end-of-generation tokens, masked while thinking, so that a
        generation never ends before its answer.
    """

    def __init__(self, *, start: int, end: int, budget: int | None,
                 thinking: bool | None = None, eog: Sequence[int] = ()) -> None:
        if budget is not None and budget < 0:
            raise ValueError("a thinking budget cannot be negative")
        self.start = start
        self.end = end
        self.budget = budget
        self.eog = [int(t) for t in eog]
        self.state: str | None = None if thinking is None else (THINKING if thinking else ANSWER)
        self.opened = thinking is True
        self.thinking_tokens = 0
        self.answer_tokens = 0
        self.forced = False
        self._prompt: int | None = None
        self._fed = 0

    def _begin(self, prompt: Sequence[int]) -> None:
        self._prompt = len(prompt)
        if self.state is None:
            last = next((int(t) for t in reversed(prompt) if t in (self.start, self.end)), None)
            self.opened = last == self.start
            self.state = THINKING if self.opened else None

    def feed(self, token: int) -> str:
        """Account for one generated token; THINKING, ANSWER or MARKER."""
        self._fed += 1
        if self.state == THINKING:
            if token == self.end:
                self.state = ANSWER
                return MARKER
            if token == self.start:
                return MARKER
            self.thinking_tokens += 1
            return THINKING
        if self.state is None and token == self.start:
            self.state = THINKING
            self.opened = True
            return MARKER
        self.state = ANSWER
        if token in (self.start, self.end):
            return MARKER  # masked; only if the caller sampled without us
        self.answer_tokens += 1
        return ANSWER

    @property
    def must_end(self) -> bool:
        return (self.state == THINKING and self.budget is not None
                and self.thinking_tokens >= self.budget)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np

        if self._prompt is None:
            self._begin(input_ids)
        else:
            for token in input_ids[self._prompt + self._fed:]:
                self.feed(int(token))
        if self.must_end:
            self.forced = True
            scores[:] = -np.inf
            scores[self.end] = 0.0
        elif self.state == ANSWER:
            scores[self.start] = -np.inf
            scores[self.end] = -np.inf
        elif self.state == THINKING:
            for token in self.eog:
                scores[token] = -np.inf
        return scores
