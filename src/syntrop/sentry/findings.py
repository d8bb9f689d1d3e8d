"""From evidence to a cause and a plan, as pure functions.

The evidence is what contextd recorded (drop-in, unit-file and config-file
changes, package upgrades with their conffile decisions, the journal slice)
and what systemd says of the unit (its job result, NeedDaemonReload, how
its main process ended, when it was last active, its directories and
dependencies: `UnitFacts`, read by phases.py). `find()` turns them into
typed findings, each marked *linked* when the evidence ties it to this
failure:

- a change is linked only when it came after the unit last ran well (its
  ActiveEnterTimestamp), the unit has not run well with it since, and
  something points at it: the start that failed began after it, the
  unit died shortly after it, the journal names it, or the exit status
  does. A recent change without such a link is reported, never undone;
- a failed dependency takes precedence over everything of the unit's own:
  systemd's `dependency` job result says the unit never got to run;
- a config file edited by hand is put back (revert_config) where toold
  offers it, else it is a human's (one restart);
- a package upgraded before the start that failed, which owns the unit's
  program (dpkg's file lists, read by phases.py), is put back to its
  previous version (downgrade_package) where toold offers it, else it is
  a human's (one restart);
- a cause beats its symptom: a linked drop-in or unit file that names the
  program found missing is the cause, not the missing program;
- when nothing is linked, the cause is what systemd and the journal say (a
  resource the journal names as busy or refused, else the exit status), and
  an old change linked only by timing loses its link to such a journal line.

`cause()` picks the finding that explains the failure (or `transient`:
nothing linked), with whether syntrop's tools can fix it. What to do about
it is plans.py's.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

SECOND = 1_000_000
#: A change is linked when the unit died within this long after it.
DIED_AFTER_USEC = 60 * SECOND
#: Clock slack between the journal, contextd's watcher and systemd.
SLACK_USEC = 1 * SECOND
#: A unit that stayed active this long after a change ran well with it.
RAN_WELL_USEC = 10 * SECOND
#: How many steps a plan may have.
MAX_STEPS = 4
#: systemd's exit status when it could not execute the program (EXIT_EXEC).
EXIT_EXEC = 203
#: systemd's exit statuses when User= or Group= name no account (EXIT_USER,
#: EXIT_GROUP).
EXIT_GROUP, EXIT_USER = 216, 217
#: si_code values of ExecMainCode.
CLD_EXITED, CLD_KILLED, CLD_DUMPED = 1, 2, 3

# Finding kinds.
DEPENDENCY = "dependency_failed"
EXEC_MISSING = "executable_missing"
STALE_DEFINITION = "stale_definition"
DROPIN = "dropin_changed"
STALE_CACHE = "stale_cache"
STALE_STATE = "stale_state"
CONFIG_REPLACED = "config_replaced"
CONFIG_EDITED = "config_edited"
PACKAGE_UPGRADED = "package_upgraded"
UNIT_FILE = "unit_file_changed"
CRASH_LOOP = "crash_loop"
RESOURCE = "resource_error"
EXIT = "exit_status"
TRANSIENT = "transient"
ACCOUNT_MISSING = "account_missing"
DISK_FULL = "disk_full"
OOM_KILLED = "oom_killed"
TRANSIENT_ERROR = "transient_error"
#: Not found by the rules: toold refused the plan, the unit is on its deny list.
PROTECTED = "unit_protected"

#: What the journal says when a resource the unit needs is taken or refused.
RESOURCE_ERRORS = ("address already in use", "permission denied",
                   "held by another process", "locked by another process",
                   "is already locked", "could not get lock", "unable to lock")

#: What the journal says when a filesystem the unit writes to is full.
FULL_ERRORS = ("no space left on device", "disk quota exceeded", "disk full")
#: What the journal says of an error that passes by itself: the same start
#: may work again.
TRANSIENT_ERRORS = ("connection refused", "temporary failure", "try again", "will retry",
                    "network is unreachable", "no route to host", "connection reset",
                    "temporarily unavailable")

#: Causes in order of precedence, and whether a plan of syntrop's tools
#: can remove them.
PRECEDENCE: tuple[tuple[str, bool], ...] = (
    (DEPENDENCY, True),
    # Before a missing program: the definition systemd runs may name one
    # the unit file on disk no longer does.
    (STALE_DEFINITION, True),
    (EXEC_MISSING, False),
    (ACCOUNT_MISSING, False),
    (DROPIN, True),
    (STALE_CACHE, True),
    (DISK_FULL, False),
    (OOM_KILLED, False),
    (STALE_STATE, False),
    # Fixable where toold offers downgrade_package (candidates, plan).
    (PACKAGE_UPGRADED, False),
    (CONFIG_REPLACED, False),
    (CONFIG_EDITED, False),
    (UNIT_FILE, False),
    (RESOURCE, False),
    (TRANSIENT_ERROR, True),
    (CRASH_LOOP, False),
)
FIXABLE = dict(PRECEDENCE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """A change contextd reported: its kind (dropin, unit_file, config,
    package, kernel), when, the path or package when there is one, its
    action (modified, upgrade, conffile, gpu, ...) and contextd's one-line
    summary."""

    kind: str
    timestamp_usec: int
    path: str | None = None
    unit: str | None = None
    action: str | None = None
    package: str | None = None
    summary: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitFacts:
    """What systemd says of the failed unit, read when its triage starts.
    Times are realtime microseconds (0: never)."""

    unit: str
    load_state: str = ""
    active_state: str = ""
    #: The service's Result: success, exit-code, signal, core-dump, timeout, …
    result: str = ""
    exec_main_code: int = 0
    exec_main_status: int = 0
    need_daemon_reload: bool = False
    #: When it last became active (ran well), and when its last start began.
    active_enter_usec: int = 0
    inactive_exit_usec: int = 0
    fragment_path: str = ""
    drop_in_paths: tuple[str, ...] = ()
    #: ExecStart= programs, and those of them that do not exist.
    exec_paths: tuple[str, ...] = ()
    missing_exec: tuple[str, ...] = ()
    #: (file, program): the unit file or drop-in whose ExecStart= names a
    #: missing program.
    missing_named_by: tuple[tuple[str, str], ...] = ()
    #: CacheDirectory=, StateDirectory=, RuntimeDirectory= as absolute paths.
    cache_dirs: tuple[str, ...] = ()
    state_dirs: tuple[str, ...] = ()
    runtime_dirs: tuple[str, ...] = ()
    #: Requires=, BindsTo=, Requisite=, and those of them that are failed now.
    requires: tuple[str, ...] = ()
    failed_dependencies: tuple[str, ...] = ()
    #: When each of `requires` not failed now last went down (its
    #: InactiveEnterTimestamp): one healed since is still the cause.
    dependencies_down: tuple[tuple[str, int], ...] = ()
    n_restarts: int = 0
    #: Filesystems (a path the journal names) found full when triage began.
    full_paths: tuple[str, ...] = ()
    #: (package, program): packages whose dpkg file list holds one of
    #: `exec_paths`, read when triage began (only those contextd saw change).
    program_packages: tuple[tuple[str, str], ...] = ()
    #: When the latest run known to have lasted RAN_WELL_USEC began (0:
    #: none). systemd shows only the current run; sentry remembers the one
    #: before its own restart, which a failure of that restart must not
    #: forget (a drop-in the unit ran well with stays unlinked).
    ran_well_usec: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One fact about the failure. `subject` is the drop-in, file, unit or
    program concerned; `linked` says the evidence ties it to the failure."""

    kind: str
    subject: str | None = None
    package: str | None = None
    at_usec: int | None = None
    linked: bool = False
    evidence: tuple[str, ...] = ()
    #: The kind of the symptom this change introduced (it names the missing
    #: program): the change, not the symptom, is the cause.
    introduced: str | None = None

    def line(self, failure_usec: int) -> str:
        """One line for the model and the incident."""
        what = {
            DEPENDENCY: f"dependency {self.subject} failed" if self.subject
            else "a dependency failed (none is failed now)",
            EXEC_MISSING: f"program {self.subject} is missing",
            STALE_DEFINITION: "systemd runs an old definition (the unit file changed on disk)",
            DROPIN: f"drop-in {self.subject} changed",
            STALE_CACHE: f"the journal names the cache {self.subject}",
            STALE_STATE: f"the journal names the state directory {self.subject}",
            CONFIG_REPLACED: f"config {self.subject} replaced by package {self.package}",
            CONFIG_EDITED: f"config {self.subject} edited",
            PACKAGE_UPGRADED: f"package {self.package} upgraded (it owns {self.subject})",
            UNIT_FILE: f"unit file {self.subject} changed",
            CRASH_LOOP: "it keeps failing with nothing changed",
            RESOURCE: f"the journal says {self.subject!r}",
            ACCOUNT_MISSING: "the account it runs as does not exist",
            DISK_FULL: f"no space left on {self.subject}" if self.subject
            else "no space left on a filesystem it writes to",
            OOM_KILLED: "killed for lack of memory",
            TRANSIENT_ERROR: f"a passing error: {self.subject!r}",
            EXIT: f"{self.subject}",
        }.get(self.kind, self.kind)
        if self.at_usec is not None:
            seconds = (failure_usec - self.at_usec) / SECOND
            what += (f" {seconds:.0f} s before the failure" if seconds >= 0
                     else f" {-seconds:.0f} s after the failure")
        return what + ("" if self.linked or self.kind == EXIT else " (not linked to it)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cause:
    """What explains the failure, and whether syntrop's tools can fix it."""

    kind: str
    fixable: bool
    summary: str
    subject: str | None = None
    package: str | None = None
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One Tool1 call of a plan."""

    tool: str
    parameters: dict[str, Any] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        return {"tool": self.tool, "parameters": dict(self.parameters)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Steps run in order, each only after the one before succeeded; none
    is a decision to act no further."""

    steps: tuple[Step, ...] = ()
    reason: str = ""

    def wire(self) -> list[dict[str, Any]]:
        return [step.wire() for step in self.steps]

    def describe(self) -> str:
        return " → ".join(step.tool for step in self.steps) or "nothing"


def _applies(change: Change, unit: str) -> bool:
    if change.unit is None or change.unit == unit:
        return True
    stem, _, suffix = change.unit.rpartition(".")
    return unit.endswith("." + suffix) and stem.endswith(("@", "-")) and unit.startswith(stem)


def _mentions(journal: Sequence[str], path: str) -> list[str]:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return [line for line in journal if path in line or (len(name) > 3 and name in line)]


def _replaced_by(change: Change, conffiles: dict[str | None, Change],
                 installed: Sequence[Change]) -> tuple[str | None, str] | None:
    """Whether a package replaced this config file, which, and why we say
    so: dpkg's conffile line for it, or (dpkg logs one only when it asks;
    an untouched conffile it replaces silently) an install or upgrade of a
    package contextd relates to the unit, just before the change."""
    conffile = conffiles.get(change.path)
    if conffile is not None and abs(conffile.timestamp_usec - change.timestamp_usec) \
            <= DIED_AFTER_USEC:
        package = conffile.package or _nearest_package(installed, conffile.timestamp_usec)
        return package, conffile.summary
    package = _nearest_package(installed, change.timestamp_usec)
    if package is None:
        return None
    return package, f"changed during the install or upgrade of {package}"


def _nearest_package(installed: Sequence[Change], at: int) -> str | None:
    """The package installed or upgraded last before `at` (within a minute;
    package logs have whole seconds)."""
    before = [c for c in installed if c.action in ("install", "upgrade", "downgrade", "reinstall")
              and at - DIED_AFTER_USEC <= c.timestamp_usec <= at + SLACK_USEC]
    return max(before, key=lambda c: c.timestamp_usec).package if before else None


def _linked_change(at: int, facts: UnitFacts, failure_usec: int, journal: Sequence[str],
                   subject: str | None, *, read_at_run_time: bool
                   ) -> tuple[bool, tuple[str, ...]]:
    """Whether a change at `at` explains the failure, and why (see the
    module). Drop-ins and unit files act when the unit starts; a config
    file may also be read by a running unit (`read_at_run_time`), so dying
    soon after it changed links it too."""
    if at > failure_usec + SLACK_USEC:
        return False, ()
    # A run that lasted started after the change was seen: it ran well with
    # it. One that started up to the slack before it was seen may or may
    # not have had it (contextd sees a write a little late): it counts,
    # unless a later start, which surely had it, failed.
    later_start_failed = facts.inactive_exit_usec > facts.active_enter_usec \
        and facts.inactive_exit_usec >= at

    def had_it(began: int) -> bool:
        return began >= at or (began + SLACK_USEC >= at and not later_start_failed)

    ran_well = (facts.active_enter_usec > 0 and had_it(facts.active_enter_usec)
                and failure_usec - facts.active_enter_usec >= RAN_WELL_USEC) \
        or (facts.ran_well_usec > 0 and had_it(facts.ran_well_usec))
    if ran_well:
        return False, ()  # the unit ran well with it since
    why: list[str] = []
    if facts.inactive_exit_usec and facts.inactive_exit_usec + SLACK_USEC >= at:
        why.append("the start that failed began after it")
    if read_at_run_time and failure_usec - at <= DIED_AFTER_USEC:
        why.append(f"the unit failed {max(0, failure_usec - at) / SECOND:.0f} s after it")
    if subject:
        why += [f"journal: {line[:160]}" for line in _mentions(journal, subject)[:2]]
    return bool(why), tuple(why)


def _dependency(trigger: str, facts: UnitFacts, failure_usec: int) -> Finding:
    """A unit that did not start because a dependency failed: which one."""
    failed = facts.failed_dependencies
    evidence = {"job_dependency": ("systemd's job result: dependency",),
                "dependency_healed": ("the dependency it waited for is healed",)}
    # Not failed now: the one that went down last, around this failure
    # (sentry may have healed it while this unit's signal queued).
    recent = sorted(((at, dep) for dep, at in facts.dependencies_down
                     if at and failure_usec - DIED_AFTER_USEC <= at
                     <= failure_usec + SLACK_USEC), reverse=True)
    subject = failed[0] if failed else (recent[0][1] if recent else None)
    return Finding(
        kind=DEPENDENCY, subject=subject, linked=True,
        evidence=evidence.get(trigger, ()) + tuple(f"{dep} is failed" for dep in failed)
        + tuple(f"{dep} went down {abs(failure_usec - at) / SECOND:.0f} s "
                f"{'before' if at <= failure_usec else 'after'} it, is back now"
                for at, dep in recent[:1] if not failed))


def _exit(facts: UnitFacts) -> list[Finding]:
    """How the main process ended, and whether its program was there."""
    found = []
    if facts.exec_main_code == CLD_EXITED and facts.exec_main_status:
        found.append(Finding(kind=EXIT, subject=f"main process exited with status "
                                                f"{facts.exec_main_status}"))
    elif facts.exec_main_code in (CLD_KILLED, CLD_DUMPED):
        found.append(Finding(kind=EXIT, subject=f"main process killed by signal "
                                                f"{facts.exec_main_status}"))
    if facts.exec_main_code == CLD_EXITED and facts.exec_main_status in (EXIT_USER, EXIT_GROUP):
        found.append(Finding(kind=ACCOUNT_MISSING, linked=True, evidence=(
            f"exit status {facts.exec_main_status} (systemd could not resolve User= or "
            "Group=)",)))
    if facts.result == "oom-kill":
        found.append(Finding(kind=OOM_KILLED, linked=True,
                             evidence=("systemd's result: oom-kill",)))
    if facts.missing_exec or (facts.exec_main_code == CLD_EXITED
                              and facts.exec_main_status == EXIT_EXEC):
        program = facts.missing_exec[0] if facts.missing_exec else \
            (facts.exec_paths[0] if facts.exec_paths else None)
        found.append(Finding(kind=EXEC_MISSING, subject=program, linked=True,
                             evidence=tuple(f"{p} does not exist" for p in facts.missing_exec)
                             or ("exit status 203 (systemd could not execute it)",)))
    return found


#: Findings of a change: the kinds a journal line may outweigh.
CHANGES = (DROPIN, UNIT_FILE, CONFIG_REPLACED, CONFIG_EDITED, PACKAGE_UPGRADED)


def _causes_over_symptoms(found: list[Finding], facts: UnitFacts,
                          new_units: set[str | None]) -> list[Finding]:
    """A linked drop-in or unit file whose ExecStart= names the missing
    program introduced the symptom: it is marked as the symptom's cause. A
    unit file created with the unit (`new_units`) changed nothing that
    worked: the program is what is missing."""
    if any(f.kind == ACCOUNT_MISSING for f in found):
        # systemd resolves User= at each start: a linked drop-in changed
        # what the start ran with, the account missing is its symptom.
        found = [replace(f, introduced=ACCOUNT_MISSING,
                         evidence=(*f.evidence, "the start after it could not resolve the "
                                                "unit's account"))
                 if f.linked and f.kind == DROPIN else f for f in found]
    if not any(f.kind == EXEC_MISSING for f in found):
        return found
    named: dict[str | None, str] = dict(facts.missing_named_by)
    return [replace(f, introduced=EXEC_MISSING,
                    evidence=(*f.evidence, f"its ExecStart= names {named[f.subject]}, "
                                           "which does not exist"))
            if f.linked and f.subject in named and (
                f.kind == DROPIN or (f.kind == UNIT_FILE and f.subject not in new_units))
            else f for f in found]


def _said(journal: Sequence[str], facts: UnitFacts) -> list[Finding]:
    """What the journal's own words (and the filesystems found full) say:
    a full disk, a passing error. The last line that says it."""
    found: list[Finding] = []
    full = [line for line in journal if any(e in line.lower() for e in FULL_ERRORS)]
    if full or facts.full_paths:
        found.append(Finding(
            kind=DISK_FULL, subject=facts.full_paths[0] if facts.full_paths else None,
            linked=True, evidence=tuple(f"journal: {line[:160]}" for line in full[-1:])
            + tuple(f"{path}: its filesystem is full" for path in facts.full_paths)))
    passing = [line for line in journal if any(e in line.lower() for e in TRANSIENT_ERRORS)]
    if passing:
        found.append(Finding(kind=TRANSIENT_ERROR, subject=passing[-1].strip()[:160],
                             linked=True, evidence=(f"journal: {passing[-1][:160]}",)))
    return found


def _resource(journal: Sequence[str]) -> Finding | None:
    """The last journal line that says a resource is taken or refused."""
    for line in reversed(journal):
        if any(error in line.lower() for error in RESOURCE_ERRORS):
            return Finding(kind=RESOURCE, subject=line.strip()[:160], linked=True,
                           evidence=(f"journal: {line[:160]}",))
    return None


def _outweighed(finding: Finding, failure_usec: int) -> Finding:
    """A change linked only because the start that failed came after it,
    made more than DIED_AFTER_USEC before the failure, is not linked when
    the journal names a busy or refused resource instead."""
    if finding.kind not in CHANGES or not finding.linked or finding.introduced \
            or finding.at_usec is None or failure_usec - finding.at_usec <= DIED_AFTER_USEC \
            or any(e.startswith("journal: ") for e in finding.evidence):
        return finding
    return replace(finding, linked=False,
                   evidence=(*finding.evidence, "the journal names another cause"))


def _upgraded(installed: Sequence[Change], facts: UnitFacts, failure_usec: int,
              journal: Sequence[str]) -> list[Finding]:
    """The upgrades of a package that owns the unit's program: its newest
    upgrade each, linked as a unit file is (the program is read when the
    unit starts: the start that failed began after it)."""
    owns = dict(facts.program_packages)
    newest: dict[str, Change] = {}
    for change in installed:
        if change.action == "upgrade" and change.package in owns and (
                change.package not in newest
                or change.timestamp_usec > newest[change.package].timestamp_usec):
            newest[change.package] = change
    found = []
    for package, change in sorted(newest.items(), key=lambda item: -item[1].timestamp_usec):
        linked, why = _linked_change(change.timestamp_usec, facts, failure_usec, journal, None,
                                     read_at_run_time=False)
        found.append(Finding(kind=PACKAGE_UPGRADED, subject=owns[package], package=package,
                             at_usec=change.timestamp_usec, linked=linked,
                             evidence=(*why, f"{package} owns {owns[package]}",
                                       *([change.summary] if change.summary else []))))
    return found


def find(unit: str, trigger: str, changes: Iterable[Change], journal: Sequence[str],
         facts: UnitFacts, failure_usec: int, *, attempts: int = 0) -> list[Finding]:
    """The findings of a failure; `attempts` counts sentry's earlier
    remediations of this unit in the breaker's window."""
    found: list[Finding] = []
    if trigger in ("job_dependency", "dependency_healed") or facts.failed_dependencies:
        # The unit never ran: nothing of its own is to blame.
        return [_dependency(trigger, facts, failure_usec)]
    found += _exit(facts)
    if facts.need_daemon_reload:
        found.append(Finding(kind=STALE_DEFINITION, subject=facts.fragment_path or None,
                             linked=True, evidence=("NeedDaemonReload=yes",)))
    # dpkg's conffile decisions name the file (and the package contextd
    # saw it configuring); installs and upgrades name only the package.
    package_paths: dict[str | None, Change] = {
        c.path: c for c in changes if c.kind == "package" and c.path}
    installed = [c for c in changes if c.kind == "package" and c.package and not c.path]
    for change in sorted(changes, key=lambda c: c.timestamp_usec, reverse=True):
        if not _applies(change, unit):
            continue
        if change.kind == "dropin":
            loaded = not facts.drop_in_paths or change.path in facts.drop_in_paths \
                or change.action == "deleted"
            linked, why = _linked_change(change.timestamp_usec, facts, failure_usec, journal,
                                         change.path, read_at_run_time=False)
            found.append(Finding(kind=DROPIN, subject=change.path, at_usec=change.timestamp_usec,
                                 linked=linked and loaded, evidence=why))
        elif change.kind == "config" and change.path:
            linked, why = _linked_change(change.timestamp_usec, facts, failure_usec, journal,
                                         change.path, read_at_run_time=True)
            replaced = _replaced_by(change, package_paths, installed)
            if replaced is not None:
                package, because = replaced
                found.append(Finding(kind=CONFIG_REPLACED, subject=change.path,
                                     package=package, at_usec=change.timestamp_usec,
                                     linked=linked, evidence=(*why, because)))
            else:
                found.append(Finding(kind=CONFIG_EDITED, subject=change.path,
                                     at_usec=change.timestamp_usec, linked=linked,
                                     evidence=why))
        elif change.kind == "unit_file" and change.path and not facts.need_daemon_reload:
            linked, why = _linked_change(change.timestamp_usec, facts, failure_usec, journal,
                                         change.path, read_at_run_time=False)
            found.append(Finding(kind=UNIT_FILE, subject=change.path,
                                 at_usec=change.timestamp_usec, linked=linked, evidence=why))
    found += _upgraded(installed, facts, failure_usec, journal)
    for kind, directories in ((STALE_CACHE, facts.cache_dirs), (STALE_STATE, facts.state_dirs)):
        for directory in directories:
            named = [line for line in journal if directory.rstrip("/") + "/" in line
                     or line.rstrip().endswith(directory.rstrip("/"))]
            if named:
                found.append(Finding(kind=kind, subject=directory, linked=True,
                                     evidence=tuple(f"journal: {line[:160]}"
                                                    for line in named[:2])))
    found = _causes_over_symptoms(found, facts, {
        c.path for c in changes if c.kind == "unit_file" and c.action == "created"})
    found += _said(journal, facts)
    resource = _resource(journal)
    if resource is not None:
        found = [_outweighed(finding, failure_usec) for finding in found] + [resource]
    if attempts and not any(f.linked for f in found):
        found.append(Finding(kind=CRASH_LOOP, linked=True,
                             evidence=(f"{attempts} earlier remediations in the window",)))
    return found


def cause(findings: Sequence[Finding], failure_usec: int) -> Cause:
    """The finding that explains the failure, by precedence; `transient`
    when nothing is linked (unlinked changes are in the evidence)."""
    introduced = {f.introduced: f for f in findings if f.linked and f.introduced}
    for kind, _ in PRECEDENCE:
        for finding in findings:
            if finding.kind == kind and finding.linked:
                # A linked change that introduced this symptom is its cause.
                chosen = introduced.get(kind, finding)
                return Cause(kind=chosen.kind, fixable=FIXABLE[chosen.kind],
                             subject=chosen.subject, package=chosen.package,
                             summary=chosen.line(failure_usec), evidence=chosen.evidence)
    unlinked = [f.line(failure_usec) for f in findings if not f.linked and f.kind != EXIT]
    exits = [f.line(failure_usec) for f in findings if f.kind == EXIT]
    return Cause(kind=TRANSIENT, fixable=True,
                 summary="no change explains it" + (f" ({exits[0]})" if exits else ""),
                 evidence=tuple(unlinked))


def ran_well_since(facts: UnitFacts, failure_usec: int) -> int:
    """The start of the latest run known to have gone well: this one, if it
    lasted RAN_WELL_USEC before failing, else the one remembered."""
    if facts.active_enter_usec and failure_usec - facts.active_enter_usec >= RAN_WELL_USEC:
        return max(facts.active_enter_usec, facts.ran_well_usec)
    return facts.ran_well_usec


def verify_hold_usec(facts: UnitFacts, failure_usec: int, minimum_usec: int,
                     maximum_usec: int) -> int:
    """How long a unit must stay active to count as healed: at least
    `minimum_usec`, and more than twice how long it ran before this failure
    (a unit that dies a second after each start is not healed by a check
    one second long)."""
    ran = failure_usec - facts.active_enter_usec if facts.active_enter_usec else 0
    wanted = max(minimum_usec, 2 * ran + SECOND) if ran > 0 else minimum_usec
    return min(wanted, maximum_usec)
