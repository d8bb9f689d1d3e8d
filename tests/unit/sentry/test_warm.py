"""The warm session's pure parts: the prompt as ChatML (the prefix and an
incident's turn, which concatenated are what a ChatML template writes for
the whole chat), which errors mean "reopen", and sentry.toml's switches."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.config import ConfigError
from syntrop.interfaces.runtime import Busy, Chunk, SessionLost, SessionNotFound, StaleOwner
from syntrop.sentry import decide
from syntrop.sentry.config import parse
from syntrop.sentry.findings import Plan, Step
from syntrop.sentry.warm import Answer, WarmSession, chatml, gone


def test_chatml_prefix_then_turn_is_the_whole_chat() -> None:
    evidence = decide.Evidence(unit="a.service", findings=["x"], cause="y", journal=[])
    offered = [Plan(steps=(Step(tool="unit_restart", parameters={"unit": "a.service"}),)),
               Plan()]
    prefix = chatml(decide.prefix_messages())
    turn = chatml(decide.suffix_messages(evidence, offered), answer=True)
    whole = chatml(decide.messages(evidence, offered), answer=True)
    assert prefix + turn == whole
    assert prefix.startswith("<|im_start|>system\n") and prefix.endswith("<|im_end|>\n")
    assert turn.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # The prefix is the same for every incident.
    assert chatml(decide.prefix_messages()) == prefix


def test_which_errors_reopen_the_session() -> None:
    assert gone(SessionNotFound(session_id="s"))
    assert gone(SessionLost(session_id="s", model="m", reason="killed"))
    assert gone(StaleOwner(session_id="s", owner_instance_id="o"))
    assert gone(ConnectionResetError())
    assert not gone(Busy(queue_depth=3))
    assert not gone(ValueError("an answer"))
    assert isinstance(Busy(queue_depth=3), VarlinkErrorReply)


def test_config() -> None:
    config = parse({"budgets": {"decide_ready": 250}})
    assert config.warm_session and config.budgets.decide_ready_usec == 250_000
    assert not parse({"warm_session": False}).warm_session
    with pytest.raises(ConfigError):
        parse({"warm_session": "yes"})


class FakeRuntime:
    """Runtime1 as the warm session calls it: sessions by id, and errors
    to answer with next."""

    def __init__(self) -> None:
        self.sessions: list[str] = []
        self.closed: list[str] = []
        self.fail: list[Exception] = []
        self.suffixes: list[str] = []

    def client(self) -> "FakeClient":
        return FakeClient(self)


class FakeClient:
    def __init__(self, runtime: FakeRuntime) -> None:
        self.runtime = runtime

    async def __aenter__(self) -> "FakeClient":
        return self

    async def __aexit__(self, *_: object) -> None:
        pass

    def close(self) -> None:
        pass

    def _maybe_fail(self) -> None:
        if self.runtime.fail:
            raise self.runtime.fail.pop(0)

    async def OpenSession(self, **_: Any) -> dict[str, Any]:
        self.runtime.sessions.append(f"s{len(self.runtime.sessions) + 1}")
        return {"session_id": self.runtime.sessions[-1], "owner_instance_id": "o"}

    async def EnsurePrefix(self, *, session_id: str, text: str, **_: Any) -> dict[str, Any]:
        self._maybe_fail()
        return {"prefix_tokens": 100, "reused_tokens": 100, "prefilled_tokens": 0}

    async def PrefillSuffix(self, *, session_id: str, text: str, **_: Any) -> dict[str, Any]:
        self._maybe_fail()
        self.runtime.suffixes.append(f"{session_id}: {text}")
        return {"prefix_tokens": 100, "suffix_tokens": 7}

    async def Decode(self, **_: Any) -> AsyncIterator[dict[str, Any]]:
        yield {"chunk": Chunk(text='{"plan":', tokens=2, finish_reason=None)}
        yield {"chunk": Chunk(text='"nothing"}', tokens=3, finish_reason="stop")}

    async def Close(self, *, session_id: str) -> None:
        self.runtime.closed.append(session_id)


def warm(runtime: FakeRuntime) -> WarmSession:
    async def model() -> tuple[str, str]:
        return "smollm2", "digest"

    session = WarmSession(model, lambda: [("system", "s")])

    async def connect() -> FakeClient:
        return runtime.client()

    session._connect = connect  # type: ignore[method-assign, assignment]  # a fake Runtime1
    return session


def test_a_session_gone_is_reopened_once_and_the_answer_given() -> None:
    runtime = FakeRuntime()
    seen: list[tuple[str, int]] = []

    async def main() -> tuple[Answer, Answer]:
        session = warm(runtime)
        first = await session.answer("turn 1", None, None, lambda t, n: seen.append((t, n)))
        runtime.fail = [SessionLost(session_id="s1", model="smollm2", reason="killed")]
        second = await session.answer("turn 2", None, None, lambda t, n: None)
        await session.close()
        return first, second

    first, second = asyncio.run(main())
    assert first.text == '{"plan":"nothing"}' and first.tokens == 5 and not first.reopened
    assert seen[-1] == ('{"plan":"nothing"}', 5)
    assert second.reopened and runtime.sessions == ["s1", "s2"]
    assert runtime.suffixes == ["s1: turn 1", "s2: turn 2"]
    assert runtime.closed == ["s2"]  # sentry's stop closes the session it holds


def test_other_errors_do_not_reopen() -> None:
    runtime = FakeRuntime()

    async def main() -> None:
        session = warm(runtime)
        await session.ready()
        runtime.fail = [Busy(queue_depth=8)]
        with pytest.raises(Busy):
            await session.answer("turn", None, None, lambda t, n: None)

    asyncio.run(main())
    assert runtime.sessions == ["s1"]


def test_ensure_reuses_the_prefix_and_reopens_a_lost_session() -> None:
    runtime = FakeRuntime()

    async def main() -> list[tuple[int, int]]:
        session = warm(runtime)
        got = [(await session.ensure())[1:]]
        runtime.fail = [StaleOwner(session_id="s1", owner_instance_id="other")]
        got.append((await session.ensure())[1:])
        return got

    assert asyncio.run(main()) == [(100, 0), (100, 0)]
    assert runtime.sessions == ["s1", "s2"]


def test_the_session_follows_the_triage_model_modeld_holds_now() -> None:
    """Opened when only SmolLM2-then-nothing was there, the session moves
    to the triage model once it is the choice: the old session is closed,
    and the next answer comes from a session of the new model."""
    runtime = FakeRuntime()
    held = ["smollm2"]

    async def model() -> tuple[str, str]:
        return held[-1], "digest"

    async def main() -> tuple[str, str, str]:
        session = WarmSession(model, lambda: [("system", "s")])

        async def connect() -> FakeClient:
            return runtime.client()

        session._connect = connect  # type: ignore[method-assign, assignment]  # a fake Runtime1
        before = (await session.ready()).model
        await session.follow("smollm2")  # the same choice: nothing happens
        held.append("qwen2.5-coder-0.5b")
        await session.follow("qwen2.5-coder-0.5b")
        await session.answer("turn", None, None, lambda t, n: None)
        after = (await session.ready()).model
        described = session.describe()
        await session.close()
        return before, after, described

    before, after, described = asyncio.run(main())
    assert (before, after) == ("smollm2", "qwen2.5-coder-0.5b")
    assert described.startswith("ready: qwen2.5-coder-0.5b")
    assert runtime.sessions == ["s1", "s2"] and runtime.suffixes == ["s2: turn"]
    assert runtime.closed == ["s1", "s2"]  # the old one at the switch, the new at the stop
