"""decide's budget is the model's, not the queue's: it starts once the model
is ready (the warm session open), and a decode still producing tokens when
it ends gets one more budget only when the rules' plan is "a human must"
(the empty plan). The fakes are driven by events, never by timings: the
decide below finishes only once the budget has ended (when the pipeline
asks how many tokens it has produced)."""

import asyncio
from typing import Any

from syntrop.sentry.findings import Plan, Step
from syntrop.sentry.pipeline import Budgets, Phases, _decide, _Run, extends

MS = 1_000
BUDGETS = Budgets(decide_usec=20 * MS, decide_ready_usec=20 * MS)
HUMAN = Plan(reason="a human must")
RESTART = Plan(steps=(Step(tool="unit_restart", parameters={"unit": "a.service"}),))
CHOSEN = Plan(steps=RESTART.steps, reason="the model's")


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += MS
        return self.now


class Model:
    """A decode that has produced `tokens` and answers only after the
    pipeline has looked at its progress (its budget ended)."""

    def __init__(self, tokens: int, *, answers: bool = True) -> None:
        self.produced = tokens
        self.answers = answers
        self.looked = asyncio.Event()
        self.asked = 0

    def tokens(self) -> int:
        self.looked.set()
        return self.produced

    async def decide(self) -> Plan:
        self.asked += 1
        await self.looked.wait()
        if not self.answers:
            await asyncio.sleep(3600)
        return CHOSEN


async def _unused(*_: object) -> Any:
    raise AssertionError("not a decide phase")


def phases(model: Model, ready: "asyncio.Future[str] | None" = None) -> Phases:
    async def wait_ready() -> str:
        assert ready is not None
        return await ready

    return Phases(context=_unused, lease=_unused, decide=_unused, execute=_unused,
                  verify=_unused, release=_unused, decide_tokens=model.tokens,
                  decide_ready=wait_ready if ready is not None else None)


def decide(model: Model, plan: Plan, ready: str | BaseException | None = None
           ) -> tuple[Plan | None, _Run]:
    async def main() -> tuple[Plan | None, _Run]:
        run = _Run(Clock())
        future: asyncio.Future[str] | None = None
        if ready is not None:
            future = asyncio.get_running_loop().create_future()
            if isinstance(ready, BaseException):
                future.set_exception(ready)
            else:
                future.set_result(ready)
        return await _decide(run, phases(model, future), BUDGETS, plan, model.decide), run
    return asyncio.run(main())


def test_the_rule() -> None:
    assert extends(HUMAN, tokens=3)
    assert not extends(HUMAN, tokens=0)  # not producing: nothing to wait for
    assert not extends(RESTART, tokens=3)  # the rules can fix it: never wait


def test_a_decode_producing_tokens_gets_one_extension_when_a_human_must() -> None:
    model = Model(tokens=5)
    chosen, run = decide(model, HUMAN)
    assert chosen == CHOSEN
    [record] = run.phases
    assert record.name == "decide" and record.outcome == "ok", record
    assert "extended once" in record.detail
    assert record.budget_usec == BUDGETS.decide_usec


def test_never_when_the_rules_hold_a_fixable_plan() -> None:
    model = Model(tokens=5)
    chosen, run = decide(model, RESTART)
    assert chosen is None
    [record] = run.phases
    assert record.outcome == "timeout" and "extended" not in record.detail, record


def test_not_when_no_token_came() -> None:
    chosen, run = decide(Model(tokens=0), HUMAN)
    assert chosen is None and run.phases[0].outcome == "timeout"


def test_one_extension_only() -> None:
    chosen, run = decide(Model(tokens=5, answers=False), HUMAN)
    assert chosen is None
    [record] = run.phases
    assert record.outcome == "timeout" and "extended once" in record.detail, record


def test_the_budget_starts_once_the_model_is_ready() -> None:
    """The wait for the session is not decide's: one record, the model's
    part, saying how long the session took to be ready."""
    model = Model(tokens=0)
    model.looked.set()  # answers at once
    chosen, run = decide(model, RESTART, ready="session of m with 9 prefix tokens")
    assert chosen == CHOSEN
    [record] = run.phases
    assert record.outcome == "ok" and record.budget_usec == BUDGETS.decide_usec
    assert "session of m with 9 prefix tokens, ready after" in record.detail, record


def test_no_session_means_the_model_is_not_asked() -> None:
    model = Model(tokens=0)
    chosen, run = decide(model, RESTART, ready=RuntimeError("no triage session: gone"))
    assert chosen is None and model.asked == 0
    [record] = run.phases
    assert record.name == "decide" and record.outcome == "failed"
    assert "no triage session" in record.detail
