"""phases.named_by (the file whose ExecStart= names a missing program) and
phases.refused (toold's refusal kept on the step it names)."""

from pathlib import Path

from syntrop.sentry.findings import Plan, Step
from syntrop.sentry.phases import named_by, refused


def test_the_dropin_that_names_a_missing_program_is_found(tmp_path: Path) -> None:
    unit = tmp_path / "web.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/web --port 80\n")
    dropin = tmp_path / "50-exec.conf"
    dropin.write_text("[Service]\nExecStart=\nExecStart=-/usr/local/bin/web-new --fast\n")
    files = (str(unit), str(dropin), str(tmp_path / "gone.conf"))
    assert named_by(files, ("/usr/local/bin/web-new",)) == \
        ((str(dropin), "/usr/local/bin/web-new"),)
    assert named_by(files, ("/usr/bin/web",)) == ((str(unit), "/usr/bin/web"),)
    assert named_by(files, ()) == ()


def test_a_refused_plan_keeps_toolds_error_name_and_words() -> None:
    plan = Plan(steps=(Step(tool="unit_restart", parameters={"unit": "db.service"}),))
    executed = refused(plan, "io.syntrop.Tool1.PlanRefused",
                       {"reason": "unit_not_allowed", "step": None,
                        "message": "db.service is not allowed"})
    assert (executed.outcome, executed.refused) == ("refused", "unit_not_allowed")
    [step] = executed.steps
    assert (step.outcome, step.message) == ("refused",
                                            "PlanRefused: db.service is not allowed")
    two = Plan(steps=(Step(tool="clear_cache"), Step(tool="bogus")))
    executed = refused(two, "io.syntrop.Tool1.PlanRefused",
                       {"reason": "unknown_tool", "step": 1, "message": "no tool 'bogus'"})
    assert [(s.outcome, s.message) for s in executed.steps] == [
        ("not_run", ""), ("refused", "PlanRefused: no tool 'bogus'")]
