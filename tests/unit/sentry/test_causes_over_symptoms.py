"""A cause beats its symptom (findings.py): a linked drop-in or unit file
that names a missing program is the cause; with nothing linked, the cause
is what systemd and the journal say, never an old change linked by timing
alone."""

from dataclasses import replace

from syntrop.sentry import findings as f
from syntrop.sentry import plans
from syntrop.sentry.findings import Change, UnitFacts

S = 1_000_000
FAIL = 1_800_000_000 * S
UNIT = "web.service"
TOOLS = ("daemon_reload", "unit_restart", "revert_dropin", "clear_cache")
DROPIN = "/etc/systemd/system/web.service.d/50-exec.conf"
FRAGMENT = "/etc/systemd/system/web.service"
GONE = "/usr/local/bin/web-new"
#: Ran well for an hour; a restart 2 s before the failure could not execute
#: its program.
MISSING = UnitFacts(unit=UNIT, active_enter_usec=FAIL - 3600 * S,
                    inactive_exit_usec=FAIL - 2 * S, drop_in_paths=(DROPIN,),
                    fragment_path=FRAGMENT, exec_main_code=f.CLD_EXITED,
                    exec_main_status=f.EXIT_EXEC, exec_paths=(GONE,), missing_exec=(GONE,))
#: A unit whose start failed at once with exit status 1.
EXITED = UnitFacts(unit=UNIT, active_enter_usec=0, inactive_exit_usec=FAIL - S,
                   fragment_path=FRAGMENT, exec_main_code=f.CLD_EXITED, exec_main_status=1)
IN_USE = "web: bind 0.0.0.0:8080: Address already in use"


def decide(changes: list[Change], facts: UnitFacts, *, journal: tuple[str, ...] = (),
           attempts: int = 0) -> tuple[list[f.Finding], f.Cause, f.Plan]:
    found = f.find(UNIT, "job_failed", changes, list(journal), facts, FAIL, attempts=attempts)
    cause = f.cause(found, FAIL)
    return found, cause, plans.plan(cause, UNIT, TOOLS, facts, restarted=attempts > 0)


def test_a_dropin_naming_a_missing_program_is_the_cause_and_reverted() -> None:
    change = Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit=UNIT, path=DROPIN)
    named = replace(MISSING, missing_named_by=((DROPIN, GONE),))
    found, cause, plan = decide([change], named)
    assert (cause.kind, cause.fixable, cause.subject) == (f.DROPIN, True, DROPIN)
    assert f"its ExecStart= names {GONE}, which does not exist" in cause.evidence
    assert [s.tool for s in plan.steps] == ["revert_dropin"]
    # The missing program is still a finding, for the reader.
    assert any(x.kind == f.EXEC_MISSING and x.subject == GONE for x in found)


def test_a_missing_program_no_change_names_stays_a_human_s() -> None:
    """The drop-in changed, but the program it is missing is the unit
    file's own (a package removed it): reverting the drop-in is no fix."""
    change = Change(kind="dropin", timestamp_usec=FAIL - 10 * S, unit=UNIT, path=DROPIN)
    _, cause, plan = decide([change], replace(MISSING, missing_named_by=((FRAGMENT, GONE),)))
    assert (cause.kind, cause.fixable, plan.steps) == (f.EXEC_MISSING, False, ())


def test_a_dropin_the_unit_ran_well_with_is_not_blamed_for_a_missing_program() -> None:
    change = Change(kind="dropin", timestamp_usec=FAIL - 900 * S, unit=UNIT, path=DROPIN)
    ran = replace(MISSING, active_enter_usec=FAIL - 600 * S, inactive_exit_usec=FAIL - 601 * S,
                  missing_named_by=((DROPIN, GONE),))
    _, cause, _ = decide([change], ran)
    assert cause.kind == f.EXEC_MISSING


def test_a_unit_file_naming_a_missing_program_is_the_cause() -> None:
    change = Change(kind="unit_file", timestamp_usec=FAIL - 10 * S, unit=UNIT, path=FRAGMENT)
    facts = replace(MISSING, missing_named_by=((FRAGMENT, GONE),))
    _, cause, plan = decide([change], facts)
    assert (cause.kind, cause.subject, cause.fixable) == (f.UNIT_FILE, FRAGMENT, False)
    assert [s.tool for s in plan.steps] == ["unit_restart"]


def test_a_unit_file_created_minutes_ago_loses_to_the_journals_address_in_use() -> None:
    """Observed: a unit file created 7 minutes earlier was named the cause
    while the journal said the address was in use."""
    created = Change(kind="unit_file", timestamp_usec=FAIL - 420 * S, unit=UNIT,
                     path=FRAGMENT, action="created")
    found, cause, plan = decide([created], EXITED, journal=(IN_USE,))
    assert (cause.kind, cause.subject, cause.fixable) == (f.RESOURCE, IN_USE, False)
    assert [x.linked for x in found if x.kind == f.UNIT_FILE] == [False]
    assert any("not linked" in line for line in (x.line(FAIL) for x in found))
    assert [s.tool for s in plan.steps] == ["unit_restart"]
    # Without the journal line, the start after it links it, as before.
    assert decide([created], EXITED)[1].kind == f.UNIT_FILE
    # A change that just came before the failure keeps its link.
    recent = replace(created, timestamp_usec=FAIL - 30 * S)
    assert decide([recent], EXITED, journal=(IN_USE,))[1].kind == f.UNIT_FILE


def test_an_old_dropin_the_journal_does_not_name_is_outweighed_by_a_refused_resource() -> None:
    change = Change(kind="dropin", timestamp_usec=FAIL - 300 * S, unit=UNIT, path=DROPIN)
    facts = replace(EXITED, drop_in_paths=(DROPIN,))
    line = "web: open /srv/web/socket: Permission denied"
    _, cause, _ = decide([change], facts, journal=(line,))
    assert (cause.kind, cause.subject) == (f.RESOURCE, line)
    # Named by the journal, the drop-in keeps its link.
    named = f"web: {DROPIN}: Permission denied"
    assert decide([change], facts, journal=(named,))[1].kind == f.DROPIN


def test_with_nothing_changed_the_journal_and_exit_status_are_the_cause() -> None:
    lock = "web: database is locked by another process"
    _, cause, plan = decide([], EXITED, journal=(lock,))
    assert (cause.kind, cause.subject) == (f.RESOURCE, lock)
    assert [s.tool for s in plan.steps] == ["unit_restart"]
    # Its restart did not hold: a human, not a crash loop.
    _, cause, plan = decide([], EXITED, journal=(lock,), attempts=1)
    assert cause.kind == f.RESOURCE and plan.steps == ()
    _, cause, _ = decide([], EXITED)
    assert cause.kind == f.TRANSIENT and "main process exited with status 1" in cause.summary


def test_a_unit_file_created_with_a_missing_program_leaves_the_program_missing() -> None:
    """A new unit changed nothing that worked: the program is what is
    missing, a human's (the system tier's missing-program scenario)."""
    created = Change(kind="unit_file", timestamp_usec=FAIL - 10 * S, unit=UNIT,
                     path=FRAGMENT, action="created")
    facts = replace(MISSING, active_enter_usec=0, missing_named_by=((FRAGMENT, GONE),))
    _, cause, plan = decide([created], facts)
    assert (cause.kind, cause.subject, plan.steps) == (f.EXEC_MISSING, GONE, ())
