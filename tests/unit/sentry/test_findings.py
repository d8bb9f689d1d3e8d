"""The rules (findings.py): evidence → findings → cause → plan, for every
finding kind, and the link rule that keeps sentry from undoing a change
the evidence does not tie to the failure."""

from dataclasses import replace

import pytest

from syntrop.sentry import findings as f
from syntrop.sentry.findings import Change, UnitFacts

S = 1_000_000
FAIL = 1_800_000_000 * S
UNIT = "web.service"
TOOLS = ("daemon_reload", "unit_restart", "revert_dropin", "clear_cache")
DROPIN = "/etc/systemd/system/web.service.d/50-bad.conf"
#: A unit that ran well for an hour, was restarted 2 s before the failure
#: (that start failed at once).
RESTARTED = UnitFacts(unit=UNIT, active_enter_usec=FAIL - 3600 * S,
                      inactive_exit_usec=FAIL - 2 * S, drop_in_paths=(DROPIN,),
                      exec_main_code=f.CLD_EXITED, exec_main_status=3)


def decide(changes: list[Change], facts: UnitFacts, *, trigger: str = "job_failed",
           journal: tuple[str, ...] = (), attempts: int = 0
           ) -> tuple[list[f.Finding], f.Cause, f.Plan]:
    found = f.find(UNIT, trigger, changes, list(journal), facts, FAIL, attempts=attempts)
    cause = f.cause(found, FAIL)
    return found, cause, f.plan(cause, UNIT, TOOLS, facts, restarted=attempts > 0)


def tools(plan: f.Plan) -> list[str]:
    return [step.tool for step in plan.steps]


def test_a_dropin_changed_before_the_failed_start_is_undone() -> None:
    change = Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit=UNIT, path=DROPIN)
    _, cause, plan = decide([change], RESTARTED)
    assert (cause.kind, cause.fixable, cause.subject) == (f.DROPIN, True, DROPIN)
    assert "the start that failed began after it" in cause.evidence
    assert plan.wire() == [{"tool": "revert_dropin",
                            "parameters": {"unit": UNIT, "scope": "persistent"}}]
    runtime = replace(change, path="/run/systemd/system/web.service.d/x.conf")
    loaded = replace(RESTARTED, drop_in_paths=(runtime.path,))
    assert decide([runtime], loaded)[2].steps[0].parameters["scope"] == "runtime"


def test_a_dropin_the_unit_ran_well_with_is_reported_never_undone() -> None:
    """Written minutes ago, the unit started and ran for minutes with it,
    then crashed: the drop-in is not linked, a restart is the plan."""
    change = Change(kind="dropin", timestamp_usec=FAIL - 900 * S, unit=UNIT, path=DROPIN)
    ran = replace(RESTARTED, active_enter_usec=FAIL - 600 * S,
                  inactive_exit_usec=FAIL - 601 * S)
    found, cause, plan = decide([change], ran, trigger="state_failed")
    assert cause.kind == f.TRANSIENT and tools(plan) == ["unit_restart"]
    assert [finding.linked for finding in found if finding.kind == f.DROPIN] == [False]
    assert any("not linked" in line for line in cause.evidence)


def test_a_dependency_failure_never_blames_the_units_own_changes() -> None:
    change = Change(kind="dropin", timestamp_usec=FAIL - 120 * S, unit=UNIT, path=DROPIN)
    waiting = replace(RESTARTED, failed_dependencies=("db.service",), requires=("db.service",))
    found, cause, plan = decide([change], waiting, trigger="job_dependency")
    assert [x.kind for x in found] == [f.DEPENDENCY]
    assert (cause.kind, cause.subject) == (f.DEPENDENCY, "db.service")
    assert plan.steps == () and "db.service" in plan.reason
    # Once db.service is healed, the start the dependency cost is retried.
    healed = replace(RESTARTED, failed_dependencies=(), requires=("db.service",))
    _, cause, plan = decide([change], healed, trigger="dependency_healed", attempts=1)
    assert cause.kind == f.DEPENDENCY and tools(plan) == ["unit_restart"]


def test_a_stale_definition_is_reloaded_then_restarted() -> None:
    _, cause, plan = decide([], replace(RESTARTED, need_daemon_reload=True))
    assert cause.kind == f.STALE_DEFINITION and tools(plan) == ["daemon_reload", "unit_restart"]


def test_a_cache_the_journal_names_is_cleared_then_restarted() -> None:
    facts = replace(RESTARTED, cache_dirs=("/var/cache/web",))
    journal = ("web: corrupt index /var/cache/web/index.db: bad magic",)
    _, cause, plan = decide([], facts, journal=journal)
    assert (cause.kind, cause.subject) == (f.STALE_CACHE, "/var/cache/web")
    assert tools(plan) == ["clear_cache", "unit_restart"]
    assert decide([], facts)[1].kind == f.TRANSIENT  # not named: not blamed


def test_a_config_a_package_replaced_gets_one_restart_then_a_human() -> None:
    config = Change(kind="config", timestamp_usec=FAIL - S, unit=UNIT, path="/etc/web/web.env",
                    action="modified")
    package = Change(kind="package", timestamp_usec=FAIL - S, path="/etc/web/web.env",
                     action="conffile", package="web-server")
    running = replace(RESTARTED, inactive_exit_usec=FAIL - 3600 * S)  # died while running
    _, cause, plan = decide([config, package], running, trigger="state_failed")
    assert (cause.kind, cause.package, cause.fixable) == (f.CONFIG_REPLACED, "web-server", False)
    assert tools(plan) == ["unit_restart"]
    assert decide([config, package], running, trigger="state_failed",
                  attempts=1)[2].steps == ()


def test_a_config_edited_by_hand_is_named_not_undone() -> None:
    config = Change(kind="config", timestamp_usec=FAIL - 30 * S, unit=UNIT,
                    path="/etc/web/web.env", action="modified")
    _, cause, plan = decide([config], RESTARTED)
    assert (cause.kind, cause.subject, cause.fixable) == (f.CONFIG_EDITED, "/etc/web/web.env",
                                                          False)
    assert tools(plan) == ["unit_restart"]


def test_a_missing_program_is_left_to_a_human_at_once() -> None:
    facts = replace(RESTARTED, exec_main_status=f.EXIT_EXEC, exec_paths=("/usr/bin/web",),
                    missing_exec=("/usr/bin/web",))
    _, cause, plan = decide([], facts)
    assert (cause.kind, cause.subject) == (f.EXEC_MISSING, "/usr/bin/web")
    assert plan.steps == ()
    assert [p.describe() for p in f.candidates(plan, UNIT, TOOLS, cause)] == ["nothing"]


def test_a_crash_loop_without_a_change_is_not_restarted_again() -> None:
    _, cause, plan = decide([], RESTARTED, trigger="backoff_retry", attempts=1)
    assert cause.kind == f.CRASH_LOOP and not cause.fixable and plan.steps == ()
    _, cause, plan = decide([], RESTARTED, trigger="state_failed")
    assert cause.kind == f.TRANSIENT and tools(plan) == ["unit_restart"]


def test_a_plan_needs_its_tools() -> None:
    cause = f.Cause(kind=f.STALE_CACHE, fixable=True, summary="", subject="/var/cache/web")
    assert f.plan(cause, UNIT, ("unit_restart",), RESTARTED).steps == ()


@pytest.mark.parametrize(("ran_s", "hold_s"), [(1.05, 5), (4, 9), (30, 12), (0, 5)])
def test_a_healed_unit_must_outlive_its_last_run(ran_s: float, hold_s: float) -> None:
    facts = replace(RESTARTED, active_enter_usec=int(FAIL - ran_s * S) if ran_s else 0)
    assert f.verify_hold_usec(facts, FAIL, 5 * S, 12 * S) == pytest.approx(hold_s * S, abs=1)


def test_the_model_chooses_among_safe_plans_only() -> None:
    change = Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit=UNIT, path=DROPIN)
    _, cause, plan = decide([change], RESTARTED)
    offered = f.candidates(plan, UNIT, TOOLS, cause)
    assert [p.describe() for p in offered] == ["revert_dropin", "unit_restart", "nothing"]
    waiting = f.Cause(kind=f.DEPENDENCY, fixable=True, summary="", subject="db.service")
    assert [p.describe() for p in f.candidates(f.Plan(), UNIT, TOOLS, waiting)] == ["nothing"]
