"""Constrained decoding over runtimed's real socket: JSON Schema, regex and
Varlink-call constraints on SmolLM2, every output strictly valid, and bad
constraints answered with InvalidConstraint before any token.

The count of generations per mode is SYNTROP_CONSTRAIN_RUNS (default 6 here;
tests/service/test_constrain_models.py runs 200 per mode in process)."""

import json
import os
import random
from collections.abc import Iterator
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.interfaces.runtime import ChatMessage, Constraint, InvalidConstraint, Sampling
from syntrop.runtimed import constrain
from tests.models import require_llama
from tests.service.runtimed_node import Node, collect, started

require_llama()

RUNS = int(os.environ.get("SYNTROP_CONSTRAIN_RUNS", "6"))

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
    "additionalProperties": False,
}
REGEX = r"(yes|no), because [a-z ]{1,40}\."


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    with started(tmp_path_factory.mktemp("constrain") / "node") as node:
        # runtimed starts on its first connection: here, not inside a test.
        ask(node, "Hi", None, 1, max_tokens=1)
        yield node


def sampling(seed: int, max_tokens: int = 8) -> Sampling:
    # A small max_tokens on purpose: a bounded constraint raises it to its
    # bound, so no value is ever cut short.
    return Sampling(max_tokens=max_tokens, temperature=1.0, top_p=None, top_k=None,
                    seed=seed, stop=None)


def ask(node: Node, question: str, wire: Constraint | None, seed: int,
        max_tokens: int = 8) -> tuple[str, str | None]:
    async def main() -> tuple[str, str | None]:
        async with await node.runtimed() as runtime:
            return await collect(runtime.Chat(
                model="smollm2", messages=[ChatMessage(role="user", content=question)],
                sampling=sampling(seed, max_tokens), constraint=wire))
    result: tuple[str, str | None] = node.run(main())
    return result


MODES: dict[str, tuple[str, Constraint, Any]] = {
    "json_schema": ("Describe Paris as JSON.", Constraint(json_schema=json.dumps(SCHEMA)),
                    lambda: constrain.from_json_schema(SCHEMA)),
    "varlink": ("Restart nginx.service.", Constraint(interface="io.syntrop.Tool1",
                                                     method="Execute"),
                lambda: constrain.from_varlink("io.syntrop.Tool1", "Execute")),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_constrained_output_parses_and_validates(node: Node, mode: str) -> None:
    question, wire, compile_ = MODES[mode]
    local = compile_()
    rng = random.Random(mode)
    for _ in range(RUNS):
        text, reason = ask(node, question, wire, rng.randrange(1 << 31))
        assert reason == "stop", (text, reason)
        constrain.check(local, text)  # raises on anything invalid
        if mode == "varlink":
            assert json.loads(text)["method"] == "io.syntrop.Tool1.Execute"


def test_a_regex_constraint_holds_on_every_seed(node: Node) -> None:
    import re

    rng = random.Random(7)
    for _ in range(RUNS):
        text, reason = ask(node, "Is the sky blue?", Constraint(regex=REGEX),
                           rng.randrange(1 << 31), max_tokens=64)
        assert re.fullmatch(REGEX, text), text
        assert reason == "stop"


def test_unconstrained_and_constrained_requests_share_the_daemon(node: Node) -> None:
    free, _ = ask(node, "Say hi.", None, 1)
    assert free
    text, _ = ask(node, "Describe Paris as JSON.", Constraint(json_schema=json.dumps(SCHEMA)), 2)
    assert set(json.loads(text)) == {"city", "population", "capital"}


@pytest.mark.parametrize(("wire", "reason"), [
    (Constraint(json_schema="{not json"), "invalid_schema"),
    (Constraint(json_schema='{"type": "no-such-type"}'), "invalid_schema"),
    (Constraint(regex="(unclosed"), "invalid_regex"),
    (Constraint(interface="io.syntrop.Nope1", method="Execute"), "unknown_interface"),
    (Constraint(interface="io.syntrop.Tool1", method="Nope"), "unknown_method"),
    (Constraint(interface="io.syntrop.Tool1"), "ambiguous"),
    (Constraint(), "ambiguous"),
    (Constraint(regex="a", json_schema="{}"), "ambiguous"),
])
def test_bad_constraints_are_declared_errors_before_any_token(
        node: Node, wire: Constraint, reason: str) -> None:
    async def main() -> None:
        async with await node.runtimed() as runtime:
            with pytest.raises(VarlinkErrorReply) as raised:
                async for _ in runtime.Complete(model="smollm2", prompt="x",
                                                sampling=sampling(1), constraint=wire):
                    pytest.fail("a token came before the error")
            assert isinstance(raised.value, InvalidConstraint)
            assert raised.value.parameters["reason"] == reason
            # The daemon is fine afterwards.
            text, _ = await collect(runtime.Complete(model="smollm2", prompt="Hello",
                                                     sampling=sampling(1, 2)))
            assert text
    node.run(main())


def test_a_session_decodes_under_a_constraint(node: Node) -> None:
    from tests.service.runtimed_node import manifest

    async def main() -> str:
        async with await node.runtimed() as runtime:
            opened = await runtime.OpenSession(owner_instance_id="t", model="smollm2")
            sid = opened["session_id"]
            await runtime.EnsurePrefix(session_id=sid, manifest=manifest(),
                                       text="Answer yes or no: is water wet?\n")
            text, _ = await collect(runtime.Decode(session_id=sid, sampling=sampling(3, 4),
                                                   constraint=Constraint(regex="(yes|no)")))
            await runtime.Close(session_id=sid)
            return text
    assert node.run(main()) in ("yes", "no")
