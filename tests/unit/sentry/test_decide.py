"""The model's decision: offers from the evidence, the prompt, and the
strict reading of answers against toold's declared parameters."""

import json
from typing import Any

import pytest

from syntrop.sentry import decide
from syntrop.sentry.decide import AnswerError, Evidence
from syntrop.sentry.rules import Change

S = 1_000_000
FAIL = 1_700_000_000 * S
UNIT_PATTERN = r"[A-Za-z0-9:_.\\@-]+\.(service|socket|target|timer)"
#: What Tool1.ListTools answers (dicts, as over the wire).
TOOLS: list[dict[str, Any]] = [
    {"name": "revert_dropin", "description": "Remove the newest drop-in", "parameters": [
        {"name": "unit", "type": "str", "required": True, "pattern": UNIT_PATTERN},
        {"name": "scope", "type": "str", "required": False, "pattern": None,
         "choices": ["persistent", "runtime"]},
        {"name": "health_window_sec", "type": "int", "required": False, "pattern": None,
         "minimum": 0, "maximum": 300}]},
    {"name": "unit_restart", "description": "Restart the unit", "parameters": [
        {"name": "unit", "type": "str", "required": True, "pattern": UNIT_PATTERN},
        {"name": "timeout_sec", "type": "int", "required": False, "pattern": None,
         "minimum": 1, "maximum": 600}]},
    {"name": "clear_cache", "description": "Clear a cache", "parameters": []},
]
KNOWN = decide.specs(TOOLS)
DROPIN = Change(kind="dropin", timestamp_usec=FAIL - 3 * S, unit="web.service",
                path="/etc/systemd/system/web.service.d/50-bad.conf", action="created")


def offered(*changes: Change) -> list[decide.Spec]:
    evidence = Evidence(unit="web.service", failure_usec=FAIL, changes=list(changes))
    return decide.offers(evidence, KNOWN, 600 * S)


def test_offers_follow_the_evidence() -> None:
    assert [s.name for s in offered()] == ["unit_restart", "none"]
    assert [s.name for s in offered(DROPIN)] == ["revert_dropin", "unit_restart", "none"]
    old = Change(kind="dropin", timestamp_usec=FAIL - 3600 * S, unit="web.service", path="/x")
    assert [s.name for s in offered(old)] == ["unit_restart", "none"]


def test_signature_names_required_and_choices() -> None:
    assert decide.signature(KNOWN["revert_dropin"]) == \
        "revert_dropin(unit, scope: persistent|runtime)"
    assert decide.signature(KNOWN["unit_restart"]) == "unit_restart(unit)"
    assert decide.signature(decide.NONE_SPEC) == "none()"


def test_prompt_has_examples_then_the_failure() -> None:
    package = Change(kind="package", timestamp_usec=FAIL - 30 * S, action="upgrade",
                     package="nginx-core", summary="dpkg upgrade nginx-core 1.0 → 1.1")
    evidence = Evidence(unit="web.service", failure_usec=FAIL, changes=[package, DROPIN],
                        journal=["web: bad config line 3"])
    chat = decide.messages(evidence, decide.offers(evidence, KNOWN, 600 * S))
    assert [role for role, _ in chat] == ["system"] + ["user", "assistant"] * 2 + ["user"]
    for _, answer in chat[2:5:2]:  # the examples offering the same tools, valid answers
        assert json.loads(answer)["tool"] == "revert_dropin"
    for question, answer in decide.EXAMPLES:
        tools = question.rsplit("tools: ", 1)[1].split("; ")
        assert json.loads(answer)["tool"] + "(" in "".join(tools)
    last = chat[-1][1]
    assert last.startswith("unit: web.service\n")
    assert "drop-in 50-bad.conf (persistent) changed 3 s before" in last
    assert "nginx-core" in last and "journal: web: bad config line 3" in last
    assert last.endswith(
        "tools: revert_dropin(unit, scope: persistent|runtime); unit_restart(unit); none()")


def test_prompt_says_when_nothing_changed() -> None:
    evidence = Evidence(unit="web.service", failure_usec=FAIL)
    assert "no file changed before the failure" in decide.messages(evidence, offered())[-1][1]


@pytest.mark.parametrize("answer, tool, parameters", [
    ('{"tool": "revert_dropin", "parameters": {"unit": "web.service", "scope": "persistent"}}',
     "revert_dropin", {"unit": "web.service", "scope": "persistent"}),
    ('  {"tool": "unit_restart", "parameters": {"unit": "web.service", "timeout_sec": 30}}\n',
     "unit_restart", {"unit": "web.service", "timeout_sec": 30}),
    ('{"tool": "none", "parameters": {}}', "none", {}),
])
def test_parse_accepts_valid_calls(answer: str, tool: str, parameters: dict[str, Any]) -> None:
    decision = decide.parse(answer, offered(DROPIN), "web.service")
    assert (decision.tool, decision.parameters) == (tool, parameters)


@pytest.mark.parametrize("answer, why", [
    ("", "not one JSON object"),
    ("restart it", "not one JSON object"),
    ('{"tool": "unit_restart", "parameters": {"unit": "web.service"}} and more',
     "not one JSON object"),
    ("[1]", "exactly"),
    ('{"tool": "unit_restart"}', "exactly"),
    ('{"tool": "unit_restart", "parameters": {}, "why": "x"}', "exactly"),
    ('{"tool": "clear_cache", "parameters": {}}', "was not offered"),
    ('{"tool": "rm -rf", "parameters": {}}', "was not offered"),
    ('{"tool": 3, "parameters": {}}', "was not offered"),
    ('{"tool": "unit_restart", "parameters": []}', "not an object"),
    ('{"tool": "unit_restart", "parameters": {}}', "missing unit"),
    ('{"tool": "unit_restart", "parameters": {"unit": "other.service"}}', "failed unit"),
    ('{"tool": "unit_restart", "parameters": {"unit": "a/b"}}', "pattern"),
    ('{"tool": "unit_restart", "parameters": {"unit": "web.service", "scope": "x"}}',
     "no parameter 'scope'"),
    ('{"tool": "unit_restart", "parameters": {"unit": "web.service", "timeout_sec": "5"}}',
     "must be int"),
    ('{"tool": "unit_restart", "parameters": {"unit": "web.service", "timeout_sec": true}}',
     "must be int"),
    ('{"tool": "unit_restart", "parameters": {"unit": "web.service", "timeout_sec": 0}}',
     "below 1"),
    ('{"tool": "revert_dropin", "parameters": {"unit": "web.service", "scope": "all"}}',
     "one of"),
    ('{"tool": "none", "parameters": {"unit": "web.service"}}', "no parameter"),
])
def test_parse_rejects_everything_else(answer: str, why: str) -> None:
    with pytest.raises(AnswerError, match=why):
        decide.parse(answer, offered(DROPIN), "web.service")


def test_revert_is_refused_when_not_offered() -> None:
    answer = '{"tool": "revert_dropin", "parameters": {"unit": "web.service"}}'
    with pytest.raises(AnswerError, match="was not offered"):
        decide.parse(answer, offered(), "web.service")


def test_schema_has_one_branch_per_offer() -> None:
    schema = decide.answer_schema(offered(DROPIN))
    branches = schema["oneOf"]
    assert [b["properties"]["tool"]["const"] for b in branches] == [
        "revert_dropin", "unit_restart", "none"]
    scope = branches[0]["properties"]["parameters"]["properties"]["scope"]
    assert scope == {"type": "string", "enum": ["persistent", "runtime"]}
    assert branches[1]["properties"]["parameters"]["required"] == ["unit"]


def test_summarise_is_one_bounded_line() -> None:
    assert decide.summarise("a\n  b") == "a b"
    assert len(decide.summarise("x" * 500)) == 160


def test_schema_pins_the_unit_and_every_answer_it_allows_parses() -> None:
    """The schema is what runtimed constrains the model's answer to: every
    answer llguidance can produce under it must pass `parse`."""
    from syntrop.runtimed import constrain

    schema = decide.answer_schema(offered(DROPIN), "web.service")
    for branch in schema["oneOf"]:
        unit = branch["properties"]["parameters"]["properties"].get("unit")
        assert unit in (None, {"const": "web.service"})
    compiled = constrain.from_json_schema(schema)
    assert compiled.max_tokens is not None  # bounded: max_tokens never truncates it
    answer = '{"tool":"unit_restart","parameters":{"unit":"web.service"}}'
    assert constrain.check(compiled, answer)
    assert decide.parse(answer, offered(DROPIN), "web.service").tool == "unit_restart"
