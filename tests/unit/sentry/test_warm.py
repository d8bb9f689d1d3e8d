"""The warm session's pure parts: the prompt as ChatML (the prefix and an
incident's turn, which concatenated are what a ChatML template writes for
the whole chat), which errors mean "reopen", and sentry.toml's switches."""

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.config import ConfigError
from syntrop.interfaces.runtime import Busy, SessionLost, SessionNotFound, StaleOwner
from syntrop.sentry import decide
from syntrop.sentry.config import parse
from syntrop.sentry.findings import Plan, Step
from syntrop.sentry.warm import chatml, gone


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
