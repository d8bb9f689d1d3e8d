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
    assert role == "user"
    assert question == ("journal: exit 1\nfacts: systemd runs an old definition\n"
                        "plans: reload, restart, nothing")
    # Every example's answer is one of its own offered plans' names, and
    # every kind of plan is some example's answer.
    answers = set()
    for example, answer in decide.EXAMPLES:
        assert json.loads(answer) in example.rsplit("plans: ", 1)[1].split(", ")
        answers.add(json.loads(answer))
    assert answers == set(decide.NAMES.values())


def test_findings_and_journal_are_shortened_the_paths_to_base_names() -> None:
    evidence = Evidence(
        unit="db.service", cause="x",
        findings=["main process exited with status 203",
                  "program /usr/local/bin/db-v2 is missing",
                  "drop-in /etc/systemd/system/db.service.d/50-db-v2.conf changed 7 s before "
                  "the failure",
                  "config /etc/db/db.conf edited 900 s before the failure (not linked to it)",
                  "the journal names the cache /var/cache/db"],
        journal=["db: bad checksum in /var/cache/db/pages.bin",
                 "db.service: Failed to locate executable /usr/local/bin/db-v2: No such file or "
                 "directory"])
    _, question = decide.suffix_messages(evidence, [NOTHING])[0]
    assert question == ("journal: bad checksum in pages.bin\n"
                        "facts: program db-v2 missing; drop-in 50-db-v2.conf changed; config "
                        "db.conf edited (unlinked); journal names cache db\nplans: nothing")
    # An exit status only alone; a signal always.
    alone = Evidence(unit="db.service", cause="x", journal=[],
                     findings=["main process exited with status 1"])
    assert decide.suffix_messages(alone, [NOTHING])[0][1].startswith("journal: -\nfacts: exit 1\n")
    assert decide.short("main process killed by signal 11") == "signal 11"
    assert decide.short("dependency net.service failed") == "dependency net failed"
    assert decide.short("dpkg: removing slapd (2.5.13) ...") == "dpkg: removing slapd"
    assert decide.short("db: segfault at 0000000000000010") == "db: segfault at 10"
    assert decide.short("unit file /etc/systemd/system/db.service changed 4 s after the "
                        "failure") == "unit file db changed after the failure"


def test_plans_are_listed_in_one_order_whatever_the_offer() -> None:
    dropin = Plan(steps=REVERT.steps, reason="undo the drop-in change that broke it "
                                             "(/etc/systemd/system/web.service.d/x.conf)")
    offered = [NOTHING, RESTART, dropin]
    assert decide.suffix_messages(EVIDENCE, offered) == decide.suffix_messages(
        EVIDENCE, offered[::-1])
    _, question = decide.suffix_messages(EVIDENCE, offered)[0]
    assert question.endswith("\nplans: undo, restart, nothing")
    assert [name for name, _ in decide.named(offered)] == ["undo", "restart", "nothing"]


def test_systemds_own_lines_are_left_out_the_units_own_kept() -> None:
    journal = ["Started web.service - web.", "web: bad option --frobnicate",
               "web.service: Main process exited, code=exited, status=3/NOTIMPLEMENTED",
               "web.service: Failed with result 'exit-code'."]
    _, question = decide.messages(Evidence(unit=UNIT, findings=["x"], cause="x",
                                           journal=journal), OFFERED)[-1]
    assert question.startswith("journal: bad option --frobnicate\n")
    assert "Main process exited" not in question and "Started web" not in question
    assert "Failed with result" not in question


def test_the_schema_accepts_exactly_the_offered_plans_names() -> None:
    schema = decide.answer_schema(OFFERED)
    validator = jsonschema.Draft202012Validator(schema)
    for name in ("reload", "restart", "nothing"):
        assert validator.is_valid(name), name
    for wrong in ("undo", "", 1, {"plan": "reload"}, RELOAD.wire(), ["reload"]):
        assert not validator.is_valid(wrong), wrong


def test_answers_are_read_strictly() -> None:
    assert decide.parse('"reload"', OFFERED) is RELOAD
    assert decide.parse(' "nothing"\n', OFFERED) is NOTHING
    for bad, why in (("", "not JSON"), ("reload", "not JSON"), ("[]", "not a JSON string"),
                     ('{"plan": "reload"}', "not a JSON string"),
                     ('"undo"', "not one of the offered"),
                     ('"Reload"', "not one of the offered"),
                     (json.dumps(RELOAD.wire()), "not a JSON string")):
        with pytest.raises(AnswerError, match=why):
            decide.parse(bad, OFFERED)


def test_plans_of_the_same_tools_get_distinct_names() -> None:
    other = Plan(steps=(Step(tool="unit_restart", parameters={"unit": "db.service"}),))
    offered = [RESTART, other, NOTHING]
    names = [name for name, _ in decide.named(offered)]
    assert sorted(names) == ["nothing", "restart", "restart_2"]
    for name, plan in decide.named(offered):
        assert decide.parse(json.dumps(name), offered) is plan


def test_the_prefix_is_the_same_for_every_offer_and_the_suffix_is_the_incident() -> None:
    prefix = decide.prefix_messages()
    assert prefix == decide.prefix_messages()
    for offered in (OFFERED, OFFERED[::-1], [REVERT, NOTHING], [NOTHING]):
        chat = decide.messages(EVIDENCE, offered)
        assert chat[:len(prefix)] == prefix
        assert chat[len(prefix):] == decide.suffix_messages(EVIDENCE, offered)
    assert [role for role, _ in decide.suffix_messages(EVIDENCE, OFFERED)] == ["user"]


def test_a_warm_answer_is_the_name_after_the_opening_quote() -> None:
    """The session's prompt opens the answer with its quote: the model
    writes the name, the closing quote (or the stop that cut it) ends it."""
    import re

    from syntrop.sentry.findings import Plan, Step

    undo = Plan(steps=(Step(tool="revert_dropin", parameters={"unit": "a.service"}),))
    restart = Plan(steps=(Step(tool="unit_restart", parameters={"unit": "a.service"}),))
    offered = [undo, restart, Plan()]
    pattern = decide.answer_regex(offered)
    assert re.fullmatch(pattern, 'undo"') and re.fullmatch(pattern, 'nothing"')
    assert not re.fullmatch(pattern, 'reload"') and not re.fullmatch(pattern, '"undo"')
    assert decide.parse_rest("restart", offered) is restart
    assert decide.parse_rest('undo"', offered) is undo
    assert decide.parse_rest("nothing", offered).steps == ()
    with pytest.raises(decide.AnswerError):
        decide.parse_rest("reload", offered)
