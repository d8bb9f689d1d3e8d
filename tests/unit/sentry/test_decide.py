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


def test_prompt_has_examples_then_the_failure_with_named_plans() -> None:
    chat = decide.messages(EVIDENCE, OFFERED)
    assert chat[0] == ("system", decide.SYSTEM)
    assert [role for role, _ in chat[1:-1]] == ["user", "assistant"] * len(decide.EXAMPLES)
    role, question = chat[-1]
    assert role == "user" and question.startswith("unit: web.service\nfindings: systemd runs")
    assert "\njournal: web: exit 1\n" in question
    assert "\ncause (the rules): systemd runs an old" in question
    assert question.endswith("\nplans: reload, restart, nothing")
    # Every example's answer is one of its own offered plans' names, and
    # every kind of plan is some example's answer.
    answers = set()
    for example, answer in decide.EXAMPLES:
        listed = [n.split(" ")[0] for n in example.rsplit("plans: ", 1)[1].split(", ")]
        assert json.loads(answer)["plan"] in listed
        answers.add(json.loads(answer)["plan"])
    assert answers == set(decide.NAMES.values())


def test_plans_are_listed_in_one_order_whatever_the_offer() -> None:
    dropin = Plan(steps=REVERT.steps, reason="undo the drop-in change that broke it "
                                             "(/etc/systemd/system/web.service.d/x.conf)")
    offered = [NOTHING, RESTART, dropin]
    assert decide.suffix_messages(EVIDENCE, offered) == decide.suffix_messages(
        EVIDENCE, offered[::-1])
    _, question = decide.suffix_messages(EVIDENCE, offered)[0]
    assert question.endswith("plans: revert_dropin (/etc/systemd/system/web.service.d/x.conf),"
                             " restart, nothing")
    assert [name for name, _ in decide.named(offered)] == ["revert_dropin", "restart",
                                                             "nothing"]


def test_systemds_own_lines_are_left_out_the_units_own_kept() -> None:
    journal = ["Started web.service - web.", "web: bad option --frobnicate",
               "web.service: Main process exited, code=exited, status=3/NOTIMPLEMENTED",
               "web.service: Failed with result 'exit-code'."]
    _, question = decide.messages(Evidence(unit=UNIT, findings=["x"], cause="x",
                                           journal=journal), OFFERED)[-1]
    assert "journal: web: bad option --frobnicate\n" in question
    assert "Main process exited" not in question and "Started web" not in question
    assert "Failed with result" not in question


def test_the_schema_accepts_exactly_the_offered_plans_names() -> None:
    schema = decide.answer_schema(OFFERED)
    validator = jsonschema.Draft202012Validator(schema)
    for name in ("reload", "restart", "nothing"):
        assert validator.is_valid({"plan": name}), name
    for wrong in ({"plan": "revert_dropin"}, {"plan": 1}, {"plan": RELOAD.wire()},
                  {"plan": "nothing", "why": "x"}, {"tool": "unit_restart"}):
        assert not validator.is_valid(wrong), wrong


def test_answers_are_read_strictly() -> None:
    assert decide.parse('{"plan":"reload"}', OFFERED) is RELOAD
    assert decide.parse(' {"plan": "nothing"}\n', OFFERED) is NOTHING
    for bad, why in (("", "not one JSON object"), ("[]", '"plan"'),
                     ('{"plan": "nothing", "x": 1}', '"plan"'),
                     ('{"plan": "revert_dropin"}', "not one of the offered"),
                     (json.dumps({"plan": RELOAD.wire()}), "not one of the offered")):
        with pytest.raises(AnswerError, match=why):
            decide.parse(bad, OFFERED)


def test_plans_of_the_same_tools_get_distinct_names() -> None:
    other = Plan(steps=(Step(tool="unit_restart", parameters={"unit": "db.service"}),))
    offered = [RESTART, other, NOTHING]
    names = [name for name, _ in decide.named(offered)]
    assert sorted(names) == ["nothing", "restart", "restart_2"]
    for name, plan in decide.named(offered):
        assert decide.parse(json.dumps({"plan": name}), offered) is plan


def test_tool_names_from_list_tools() -> None:
    assert decide.tool_names([{"name": "unit_restart"}, {"name": "clear_cache"}]) == [
        "unit_restart", "clear_cache"]


def test_the_prefix_is_the_same_for_every_offer_and_the_suffix_is_the_incident() -> None:
    prefix = decide.prefix_messages()
    assert prefix == decide.prefix_messages()
    for offered in (OFFERED, OFFERED[::-1], [REVERT, NOTHING], [NOTHING]):
        chat = decide.messages(EVIDENCE, offered)
        assert chat[:len(prefix)] == prefix
        assert chat[len(prefix):] == decide.suffix_messages(EVIDENCE, offered)
    assert [role for role, _ in decide.suffix_messages(EVIDENCE, OFFERED)] == ["user"]
