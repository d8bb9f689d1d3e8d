"""The rules (findings.py): evidence → findings → cause → plan, for every
finding kind, and the link rule that keeps sentry from undoing a change
the evidence does not tie to the failure."""

from dataclasses import replace
from pathlib import Path

import pytest

from syntrop.sentry import findings as f
from syntrop.sentry import plans
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
    return found, cause, plans.plan(cause, UNIT, TOOLS, facts, restarted=attempts > 0)


def tools(plan: f.Plan) -> list[str]:
    return [step.tool for step in plan.steps]


def test_a_dropin_changed_before_the_failed_start_is_undone() -> None:
    change = Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit=UNIT, path=DROPIN)
    _, cause, plan = decide([change], RESTARTED)
    assert (cause.kind, cause.fixable, cause.subject) == (f.DROPIN, True, DROPIN)
    assert "the start that failed began after it" in cause.evidence
    assert plan.wire() == [{"tool": "revert_dropin",
                            "parameters": {"unit": UNIT, "scope": "persistent"}}]
    runtime_path = "/run/systemd/system/web.service.d/x.conf"
    runtime = replace(change, path=runtime_path)
    loaded = replace(RESTARTED, drop_in_paths=(runtime_path,))
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


@pytest.mark.parametrize("started_after", [-0.5, 0.2])
def test_a_unit_started_about_when_a_change_was_seen_ran_well_with_it(
        started_after: float) -> None:
    """A unit file written, reloaded and started within a second, then 11 s
    of running well: the change is not linked to the crash (nor is one
    seen half a second after the start: the next start would apply it)."""
    at = FAIL - 12 * S
    change = Change(kind="unit_file", timestamp_usec=at, unit=UNIT,
                    path="/etc/systemd/system/web.service")
    began = at + int(started_after * S)
    ran = replace(RESTARTED, active_enter_usec=began, inactive_exit_usec=began - S // 10)
    _, cause, plan = decide([change], ran, trigger="state_failed")
    assert cause.kind == f.TRANSIENT and tools(plan) == ["unit_restart"]
    # Restarted 2 s before the failure: that start began after the change.
    short = replace(ran, active_enter_usec=FAIL - 2 * S, inactive_exit_usec=FAIL - 3 * S)
    assert decide([change], short, trigger="state_failed")[1].kind == f.UNIT_FILE


def test_a_start_after_a_change_that_fails_links_it_though_a_run_before_went_well() -> None:
    """Found in CI: the unit started, its config was edited 0.6 s later
    (within the slack), it ran 11 s, then a restart failed at once (never
    active, so ActiveEnterTimestamp is still the old run's). The old run may
    not have had the edit; the failed start surely did: linked."""
    config = "/etc/web/app.env"
    at = FAIL - 11 * S
    change = Change(kind="config", timestamp_usec=at, unit=UNIT, path=config)
    facts = replace(RESTARTED, active_enter_usec=at - 6 * S // 10,
                    inactive_exit_usec=FAIL - S // 10)
    found, cause, _ = decide([change], facts, trigger="state_failed")
    assert (cause.kind, cause.subject) == (f.CONFIG_EDITED, config), found
    assert "the start that failed began after it" in cause.evidence
    # The old run began after the edit was seen: it had it, and ran well.
    had = replace(facts, active_enter_usec=at + S // 5)
    assert decide([change], had, trigger="state_failed")[1].kind == f.TRANSIENT


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


def test_a_dependency_healed_before_its_dependents_triage_is_still_named() -> None:
    """sentry healed db.service while app's own signal queued: db is active
    again, but it went down at the failure, and it alone did."""
    back = replace(RESTARTED, requires=("db.service", "log.service"),
                   dependencies_down=(("db.service", FAIL - S), ("log.service", FAIL - 3600 * S)))
    found, cause, plan = decide([], back, trigger="job_dependency")
    assert (cause.kind, cause.subject) == (f.DEPENDENCY, "db.service")
    assert any("db.service went down 1 s before it" in line for line in found[0].evidence)
    assert tools(plan) == ["unit_restart"]
    # None went down around it: the dependency is unnamed, not guessed.
    old = replace(back, dependencies_down=(("log.service", FAIL - 3600 * S),))
    _, cause, _ = decide([], old, trigger="job_dependency")
    assert (cause.kind, cause.subject) == (f.DEPENDENCY, None)


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
    # A conffile decision dpkg did not log under a package: the package
    # installed or upgraded just before it is named.
    unnamed = replace(package, package=None)
    upgrade = Change(kind="package", timestamp_usec=FAIL - 2 * S, action="upgrade",
                     package="web-server")
    older = Change(kind="package", timestamp_usec=FAIL - 3 * S, action="upgrade",
                   package="libc6")
    _, cause, _ = decide([config, unnamed, older, upgrade], running, trigger="state_failed")
    assert (cause.kind, cause.package) == (f.CONFIG_REPLACED, "web-server")
    # dpkg replaces an untouched conffile without a word: the upgrade just
    # before the change (of a package contextd relates to the unit) did.
    _, cause, _ = decide([config, older, upgrade], running, trigger="state_failed")
    assert (cause.kind, cause.package) == (f.CONFIG_REPLACED, "web-server")
    assert "changed during the install or upgrade of web-server" in cause.evidence
    # An upgrade an hour earlier is not it: edited by hand.
    long_ago = replace(upgrade, timestamp_usec=FAIL - 3600 * S)
    _, cause, _ = decide([config, long_ago], running, trigger="state_failed")
    assert cause.kind == f.CONFIG_EDITED


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
    assert [p.describe() for p in plans.candidates([], plan, cause, UNIT, TOOLS, facts, FAIL)] == \
        ["nothing"]


def test_a_crash_loop_without_a_change_is_not_restarted_again() -> None:
    _, cause, plan = decide([], RESTARTED, trigger="backoff_retry", attempts=1)
    assert cause.kind == f.CRASH_LOOP and not cause.fixable and plan.steps == ()
    _, cause, plan = decide([], RESTARTED, trigger="state_failed")
    assert cause.kind == f.TRANSIENT and tools(plan) == ["unit_restart"]


def test_a_plan_needs_its_tools() -> None:
    cause = f.Cause(kind=f.STALE_CACHE, fixable=True, summary="", subject="/var/cache/web")
    assert plans.plan(cause, UNIT, ("unit_restart",), RESTARTED).steps == ()


@pytest.mark.parametrize(("ran_s", "hold_s"), [(1.05, 5), (4, 9), (30, 12), (0, 5)])
def test_a_healed_unit_must_outlive_its_last_run(ran_s: float, hold_s: float) -> None:
    facts = replace(RESTARTED, active_enter_usec=int(FAIL - ran_s * S) if ran_s else 0)
    assert f.verify_hold_usec(facts, FAIL, 5 * S, 12 * S) == pytest.approx(hold_s * S, abs=1)


def test_the_model_chooses_among_safe_plans_only() -> None:
    change = Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit=UNIT, path=DROPIN)
    found, cause, plan = decide([change], RESTARTED)

    def offered(found: list[f.Finding], cause: f.Cause, plan: f.Plan,
                facts: UnitFacts = RESTARTED) -> list[str]:
        return [p.describe()
                for p in plans.candidates(found, plan, cause, UNIT, TOOLS, facts, FAIL)]

    # A fixable cause: its plan first, a restart (which may be wrong: then
    # the pipeline tries the next), or nothing.
    assert offered(found, cause, plan) == ["revert_dropin", "unit_restart", "nothing"]
    # Two fixable findings linked: the rules' first, the other as well.
    facts = replace(RESTARTED, cache_dirs=("/var/cache/web",))
    journal = ("web: corrupt index /var/cache/web/index.db",)
    found, cause, plan = decide([change], facts, journal=journal)
    assert offered(found, cause, plan, facts) == ["revert_dropin", "clear_cache → unit_restart",
                                                  "unit_restart", "nothing"]
    # A stale definition: reload beside restart; no reload without one.
    stale = replace(RESTARTED, need_daemon_reload=True)
    found, cause, plan = decide([], stale)
    assert offered(found, cause, plan, stale) == ["daemon_reload → unit_restart",
                                                  "unit_restart", "nothing"]
    # Nothing linked: a restart or nothing.
    found, cause, plan = decide([], RESTARTED, trigger="state_failed")
    assert offered(found, cause, plan) == ["unit_restart", "nothing"]
    # Out of reach after sentry's restart, or waiting: nothing to choose.
    config = Change(kind="config", timestamp_usec=FAIL - 30 * S, unit=UNIT,
                    path="/etc/web/web.env", action="modified")
    found, cause, plan = decide([config], RESTARTED, attempts=1)
    assert offered(found, cause, plan) == ["nothing"]
    waiting = f.Cause(kind=f.DEPENDENCY, fixable=True, summary="", subject="db.service")
    assert offered([], waiting, f.Plan()) == ["nothing"]


def offered_for(found: list[f.Finding], cause: f.Cause, plan: f.Plan,
                facts: UnitFacts = RESTARTED) -> list[str]:
    return [p.describe() for p in plans.candidates(found, plan, cause, UNIT, TOOLS, facts, FAIL)]


def test_a_full_disk_is_a_human_s_and_no_restart_is_offered() -> None:
    for facts, journal in (
            (RESTARTED, ("web: write /var/lib/web/log: No space left on device",)),
            (replace(RESTARTED, full_paths=("/var/lib/web/log",)), ("web: write failed",))):
        found, cause, plan = decide([], facts, journal=journal)
        assert (cause.kind, cause.fixable) == (f.DISK_FULL, False), cause
        assert plan.steps == () and "a human must" in plan.reason
        assert offered_for(found, cause, plan, facts) == ["nothing"]


def test_an_account_that_does_not_exist_is_a_human_s_unless_a_drop_in_set_it() -> None:
    no_user = replace(RESTARTED, exec_main_status=f.EXIT_USER)
    found, cause, plan = decide([], no_user)
    assert cause.kind == f.ACCOUNT_MISSING and plan.steps == ()
    assert offered_for(found, cause, plan, no_user) == ["nothing"]
    # A drop-in changed before the start that could not resolve it: its cause.
    change = Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit=UNIT, path=DROPIN)
    found, cause, plan = decide([change], replace(no_user, drop_in_paths=(DROPIN,)))
    assert (cause.kind, cause.subject) == (f.DROPIN, DROPIN) and tools(plan) == ["revert_dropin"]


def test_a_passing_error_is_restarted_even_beside_an_old_dropin() -> None:
    old = Change(kind="dropin", timestamp_usec=FAIL - 7200 * S, unit=UNIT, path=DROPIN)
    _found, cause, plan = decide(
        [old], RESTARTED, trigger="state_failed",
        journal=("web: upstream 127.0.0.1:5432: connection refused (will retry later)",))
    assert cause.kind == f.TRANSIENT_ERROR and tools(plan) == ["unit_restart"]
    assert "a passing error" in cause.summary


def test_a_unit_killed_for_memory_gets_one_restart() -> None:
    oom = replace(RESTARTED, result="oom-kill", exec_main_code=f.CLD_KILLED, exec_main_status=9)
    _found, cause, plan = decide([], oom, trigger="state_failed")
    assert (cause.kind, cause.fixable) == (f.OOM_KILLED, False)
    assert tools(plan) == ["unit_restart"] and "one restart, then a human" in plan.reason
    _, _, again = decide([], oom, trigger="state_failed", attempts=1)
    assert again.steps == ()


def test_the_paths_a_journal_names_and_which_filesystems_are_full(monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    import os

    from syntrop.sentry import phases

    assert phases.named_paths(['pg: could not write "/srv/pg/wal/x.tmp": No space', "a /b",
                               "again /srv/pg/wal/x.tmp", "url http://h/p"]) == \
        ["/srv/pg/wal/x.tmp", "/b"]

    class Vfs:
        def __init__(self, blocks: int, available: int) -> None:
            self.f_blocks, self.f_bavail = blocks, available

    sizes = {"/srv": Vfs(1000, 0), "/var": Vfs(1000, 500)}
    monkeypatch.setattr(os, "statvfs", lambda path: sizes["/" + path.split("/")[1]])
    monkeypatch.setattr(os.path, "exists", lambda path: path in ("/srv", "/var"))
    monkeypatch.setattr(os, "stat", lambda path: os.stat_result((0,) * 2 + (hash(path[:4]),)
                                                                 + (0,) * 7))
    assert phases.full_filesystems(["/srv/pg/wal/x.tmp", "/var/log/a", "/srv/other"]) == \
        ("/srv/pg/wal/x.tmp",)


def test_a_config_edited_by_hand_is_put_back_where_toold_offers_it() -> None:
    config = Change(kind="config", timestamp_usec=FAIL - 2 * S, unit=UNIT,
                    path="/etc/web/web.env", action="modified")
    found = f.find(UNIT, "state_failed", [config], ["web: bad MODE in /etc/web/web.env"],
                   RESTARTED, FAIL)
    cause = f.cause(found, FAIL)
    with_tool = (*TOOLS, "revert_config")
    plan = plans.plan(cause, UNIT, with_tool, RESTARTED)
    assert [s.wire() for s in plan.steps] == [
        {"tool": "revert_config", "parameters": {"unit": UNIT, "path": "/etc/web/web.env"}}]
    assert [p.describe() for p in plans.candidates(found, plan, cause, UNIT, with_tool, RESTARTED,
                                               FAIL)] == ["revert_config", "unit_restart",
                                                          "nothing"]
    # Without the tool: one restart, as before.
    assert tools(plans.plan(cause, UNIT, TOOLS, RESTARTED)) == ["unit_restart"]


def test_a_full_filesystem_found_by_statvfs_is_freed_where_toold_offers_it() -> None:
    full = replace(RESTARTED, full_paths=("/var/lib/web/log",))
    journal = ("web: write /var/lib/web/log: No space left on device",)
    found = f.find(UNIT, "state_failed", [], list(journal), full, FAIL)
    cause = f.cause(found, FAIL)
    with_tool = (*TOOLS, "free_space")
    plan = plans.plan(cause, UNIT, with_tool, full)
    assert [s.wire() for s in plan.steps] == [
        {"tool": "free_space", "parameters": {"unit": UNIT, "path": "/var/lib/web/log"}},
        {"tool": "unit_restart", "parameters": {"unit": UNIT}}]
    assert [p.describe() for p in plans.candidates(found, plan, cause, UNIT, with_tool, full,
                                               FAIL)] == ["free_space → unit_restart",
                                                          "unit_restart", "nothing"]
    # Words alone name no filesystem to free: a human's, as without the tool.
    found = f.find(UNIT, "state_failed", [], list(journal), RESTARTED, FAIL)
    cause = f.cause(found, FAIL)
    assert plans.plan(cause, UNIT, with_tool, RESTARTED).steps == ()


def test_an_upgrade_of_the_program_s_package_is_downgraded_where_toold_offers_it() -> None:
    program = "/usr/bin/web"
    facts = replace(RESTARTED, exec_paths=(program,), program_packages=(("web-server", program),))
    upgrade = Change(kind="package", timestamp_usec=FAIL - 30 * S, action="upgrade",
                     package="web-server", summary="upgrade web-server 1.0 -> 2.0")
    other = Change(kind="package", timestamp_usec=FAIL - 20 * S, action="upgrade",
                   package="libfoo", summary="upgrade libfoo")
    journal = ["web: unsupported option --legacy"]
    found = f.find(UNIT, "state_failed", [upgrade, other], journal, facts, FAIL)
    cause = f.cause(found, FAIL)
    assert (cause.kind, cause.package, cause.subject) == (f.PACKAGE_UPGRADED, "web-server",
                                                          program)
    assert "the start that failed began after it" in cause.evidence
    with_tool = (*TOOLS, "downgrade_package")
    plan = plans.plan(cause, UNIT, with_tool, facts)
    assert [s.wire() for s in plan.steps] == [
        {"tool": "downgrade_package", "parameters": {"unit": UNIT, "package": "web-server"}}]
    assert [p.describe() for p in plans.candidates(found, plan, cause, UNIT, with_tool, facts,
                                               FAIL)] == ["downgrade_package", "unit_restart",
                                                          "nothing"]
    # Without the tool: one restart, then a human.
    assert [s.tool for s in plans.plan(cause, UNIT, TOOLS, facts).steps] == ["unit_restart"]
    # The unit ran well since the upgrade: not linked.
    ran_well = replace(facts, active_enter_usec=FAIL - 25 * S, inactive_exit_usec=FAIL - 25 * S)
    found = f.find(UNIT, "state_failed", [upgrade], journal, ran_well, FAIL)
    assert [(x.kind, x.linked) for x in found if x.kind == f.PACKAGE_UPGRADED] == [
        (f.PACKAGE_UPGRADED, False)]
    # A package that owns no program of the unit is no finding.
    found = f.find(UNIT, "state_failed", [other], journal, facts, FAIL)
    assert all(x.kind != f.PACKAGE_UPGRADED for x in found)


def test_a_linked_upgrade_is_offered_beside_another_cause() -> None:
    program = "/usr/bin/web"
    facts = replace(RESTARTED, exec_paths=(program,), program_packages=(("web-server", program),),
                    cache_dirs=("/var/cache/web",))
    upgrade = Change(kind="package", timestamp_usec=FAIL - 30 * S, action="upgrade",
                     package="web-server")
    journal = ["web: corrupt index /var/cache/web/index.db"]
    found = f.find(UNIT, "state_failed", [upgrade], journal, facts, FAIL)
    cause = f.cause(found, FAIL)
    with_tool = (*TOOLS, "downgrade_package")
    plan = plans.plan(cause, UNIT, with_tool, facts)
    assert cause.kind == f.STALE_CACHE
    assert [p.describe() for p in plans.candidates(found, plan, cause, UNIT, with_tool, facts,
                                               FAIL)] == [
        "clear_cache → unit_restart", "downgrade_package", "unit_restart", "nothing"]


def test_dpkg_s_file_lists_say_which_changed_package_owns_the_program(tmp_path: Path) -> None:
    from syntrop.sentry import phases

    (tmp_path / "web-server.list").write_text("/.\n/usr\n/usr/bin\n/usr/bin/web\n")
    (tmp_path / "libfoo:amd64.list").write_text("/usr/lib/libfoo.so.1\n")
    (tmp_path / "web-tools:amd64.list").write_text("/usr/sbin/webctl\n")
    (tmp_path / "web-server.md5sums").write_text("/usr/bin/other\n")
    found = phases.program_packages(("/usr/bin/web", "/sbin/webctl"),
                                    ["web-server", "libfoo", "web-tools", "absent"],
                                    str(tmp_path))
    # /sbin/webctl is /usr/sbin/webctl across a merged /usr.
    assert found == (("web-server", "/usr/bin/web"), ("web-tools", "/sbin/webctl"))
    assert phases.program_packages((), ["web-server"], str(tmp_path)) == ()
    assert phases.program_packages(("/usr/bin/web",), ["web-server"],
                                   str(tmp_path / "none")) == ()
