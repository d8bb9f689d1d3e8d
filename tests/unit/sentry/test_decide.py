"""The model's plan: the prompt, the answer schema (exactly the offered
plans: checked with an independent JSON Schema validator), and the strict
reading of answers."""

import json

import jsonschema
import pytest

from syntrop.sentry import decide
from syntrop.sentry.decide import AnswerError, Evidence
from syntrop.sentry.findings import Plan, Step

UNIT = "web.service"
REVERT = Plan(steps=(Step(tool="revert_dropin", parameters={"unit": UNIT,
                                                            "scope": "persistent"}),))
RELOAD = Plan(steps=(Step(tool="daemon_reload"), Step(tool="unit_restart",
                                                      parameters={"unit": UNIT})))
RESTART = Plan(steps=(Step(tool="unit_restart", parameters={"unit": UNIT}),))
NOTHING = Plan(reason="no action")
OFFERED = [RELOAD, RESTART, NOTHING]
EVIDENCE = Evidence(unit=UNIT, findings=["systemd runs an old definition"],
                    cause="systemd runs an old definition", journal=["web: exit 1"])


def test_prompt_has_examples_then_the_failure_with_numbered_plans() -> None:
    chat = decide.messages(EVIDENCE, OFFERED)
    assert chat[0] == ("system", decide.SYSTEM)
    assert [role for role, _ in chat[1:-1]] == ["user", "assistant"] * len(decide.EXAMPLES)
    role, question = chat[-1]
    assert role == "user" and question.startswith("unit: web.service\nfindings: systemd runs")
    assert "journal: web: exit 1" in question and "\ncause: systemd runs an old" in question
    assert '1. [{"tool":"daemon_reload","parameters":{}},{"tool":"unit_restart"' in question
    assert question.endswith("3. []")
    # Every example's answer is one of its own offered plans, parsed strictly.
    for example, answer in decide.EXAMPLES:
        assert json.loads(answer)["plan"] == json.loads(
            example.split("plans:\n")[1].splitlines()[0].split(". ", 1)[1])


def test_systemds_own_lines_are_left_out_the_units_own_kept() -> None:
    journal = ["Started web.service - web.", "web: bad option --frobnicate",
               "web.service: Main process exited, code=exited, status=3/NOTIMPLEMENTED",
               "web.service: Failed with result 'exit-code'."]
    _, question = decide.messages(Evidence(unit=UNIT, findings=["x"], cause="x",
                                           journal=journal), OFFERED)[-1]
    assert "journal: web: bad option --frobnicate" in question
    assert "Main process exited" not in question and "Started web" not in question
    assert "Failed with result" not in question


def test_the_schema_accepts_exactly_the_offered_plans() -> None:
    schema = decide.answer_schema(OFFERED)
    validator = jsonschema.Draft202012Validator(schema)
    for plan in OFFERED:
        assert validator.is_valid({"plan": plan.wire()}), plan
    for wrong in ({"plan": REVERT.wire()}, {"plan": RELOAD.wire()[::-1]},
                  {"plan": RELOAD.wire()[:1]}, {"plan": RESTART.wire() * 2},
                  {"plan": [{"tool": "unit_restart", "parameters": {"unit": "sshd.service"}}]},
                  {"plan": [], "why": "x"}, {"tool": "unit_restart"}):
        assert not validator.is_valid(wrong), wrong


def test_answers_are_read_strictly() -> None:
    assert decide.parse(json.dumps({"plan": RELOAD.wire()}), OFFERED) is RELOAD
    assert decide.parse(' {"plan": []}\n', OFFERED) is NOTHING
    for bad, why in (("", "not one JSON object"), ("[]", '"plan"'),
                     ('{"plan": [], "x": 1}', '"plan"'),
                     (json.dumps({"plan": REVERT.wire()}), "not one of the offered"),
                     ('{"plan": [{"tool": "unit_restart", "parameters": {"unit": "web.service",'
                      ' "timeout_sec": 600}}]}', "not one of the offered")):
        with pytest.raises(AnswerError, match=why):
            decide.parse(bad, OFFERED)


def test_tool_names_from_list_tools() -> None:
    assert decide.tool_names([{"name": "unit_restart"}, {"name": "clear_cache"}]) == [
        "unit_restart", "clear_cache"]
