"""From a cause to what to do, as pure functions.

`plan()` maps a cause (findings.py) to a short ordered plan over the tools
toold lists: the rules' answer. `candidates()` gives every plan that could
apply, for the model to choose from and for the pipeline to try in turn
(the rules' plan, the plans of the other linked findings, restart, reload
and clear where they have something to act on, nothing). Causes out of the
tools' reach (a config file a package replaced, a missing binary, a crash
loop without a change) get at most one restart.
"""

from collections.abc import Iterable, Sequence

from syntrop.sentry.findings import (
    ACCOUNT_MISSING,
    CONFIG_EDITED,
    CRASH_LOOP,
    DEPENDENCY,
    DISK_FULL,
    DROPIN,
    EXEC_MISSING,
    PACKAGE_UPGRADED,
    PRECEDENCE,
    STALE_CACHE,
    STALE_DEFINITION,
    TRANSIENT,
    TRANSIENT_ERROR,
    Cause,
    Finding,
    Plan,
    Step,
    UnitFacts,
)


def plan(cause: Cause, unit: str, tools: Iterable[str], facts: UnitFacts,
         *, restarted: bool = False) -> Plan:
    """The rules' plan for a cause. `restarted`: sentry already acted on the
    unit in the breaker's window, so a cause its tools cannot fix gets no
    second restart."""
    have = set(tools)

    def steps(*wanted: Step) -> tuple[Step, ...]:
        return wanted if all(step.tool in have for step in wanted) else ()

    restart = Step(tool="unit_restart", parameters={"unit": unit})
    if cause.kind == DEPENDENCY:
        if facts.failed_dependencies:
            return Plan(reason=f"wait for {cause.subject}: sentry triages it, then retries "
                               f"{unit}'s start")
        return Plan(steps=steps(restart), reason="the dependency is back: retry the lost start")
    if cause.kind == STALE_DEFINITION:
        found = steps(Step(tool="daemon_reload"), restart)
        return Plan(steps=found, reason="systemd runs an old definition: reload, then restart")
    if cause.kind == DROPIN:
        scope = "runtime" if (cause.subject or "").startswith("/run/") else "persistent"
        return Plan(steps=steps(Step(tool="revert_dropin",
                                     parameters={"unit": unit, "scope": scope})),
                    reason=f"undo the drop-in change that broke it ({cause.subject})")
    if cause.kind == STALE_CACHE:
        return Plan(steps=steps(Step(tool="clear_cache", parameters={"unit": unit}), restart),
                    reason=f"clear the cache the journal names ({cause.subject}), then restart")
    if cause.kind == CONFIG_EDITED and cause.subject and "revert_config" in have:
        return Plan(steps=(Step(tool="revert_config",
                                parameters={"unit": unit, "path": cause.subject}),),
                    reason=f"put back the config file edited before it ({cause.subject})")
    if cause.kind == PACKAGE_UPGRADED and cause.package and "downgrade_package" in have:
        return Plan(steps=(Step(tool="downgrade_package",
                                parameters={"unit": unit, "package": cause.package}),),
                    reason=f"put {cause.package} back to its previous version: its upgrade "
                           f"before the failure changed {cause.subject}")
    if cause.kind == DISK_FULL and cause.subject and "free_space" in have:
        return Plan(steps=steps(Step(tool="free_space",
                                     parameters={"unit": unit, "path": cause.subject}), restart),
                    reason=f"free the unit's cache and the journal on {cause.subject}'s "
                           "filesystem, then restart")
    if cause.kind == TRANSIENT:
        return Plan(steps=steps(restart), reason="nothing explains it: restart")
    if cause.kind == TRANSIENT_ERROR and not restarted:
        return Plan(steps=steps(restart), reason="a passing error: restart")
    if cause.kind in (EXEC_MISSING, CRASH_LOOP, ACCOUNT_MISSING, DISK_FULL) or restarted:
        return Plan(reason=f"{cause.summary}: no tool can fix it; a human must")
    return Plan(steps=steps(restart),
                reason=f"{cause.summary}: no tool can undo it; one restart, then a human")


def candidates(found: Sequence[Finding], rules: Plan, cause: Cause, unit: str,
               tools: Iterable[str], facts: UnitFacts, failure_usec: int) -> list[Plan]:
    """Every plan that could apply, for the model to choose from and for
    the pipeline to try in turn: the rules' plan first, the plan of every
    other linked finding a tool can fix (each linked change's undo), a
    restart, a reload where systemd runs an old definition, clearing the
    cache where the unit has one, and nothing. The rules only fence: they
    leave out what has nothing to act on (no reload without a stale
    definition, no clear without a cache directory, no undo without a
    linked drop-in, a tool toold does not list, no restart where the rules
    know it cannot help: a missing program, a cause out of reach that had
    its restart) and a unit whose start waits for a failed dependency gets
    no plan of its own. A restart is
    offered beside a fixable cause too: it may be wrong, and then it is
    undone cheaply (it changed nothing) and the next plan tried
    (pipeline's try → verify → next)."""
    tools = tuple(tools)
    have = set(tools)
    offered = [rules] if rules.steps else []

    def offer(plan_: Plan) -> None:
        if plan_.steps and all(s.tool in have for s in plan_.steps) \
                and all(plan_.steps != p.steps for p in offered):
            offered.append(plan_)

    if cause.kind == DEPENDENCY and facts.failed_dependencies:
        return [*offered, Plan(reason="no action")]
    fixable = {kind for kind, can in PRECEDENCE if can} - {DEPENDENCY}
    if "revert_config" in have:
        fixable.add(CONFIG_EDITED)  # an edit toold can put back
    if "free_space" in have:
        fixable.add(DISK_FULL)  # a full filesystem toold may make room on
    if "downgrade_package" in have:
        fixable.add(PACKAGE_UPGRADED)  # an upgrade toold can put back
    for finding in found:
        if finding.linked and finding.kind in fixable and finding.kind != cause.kind:
            offer(plan(Cause(kind=finding.kind, fixable=True, subject=finding.subject,
                             package=finding.package, summary=finding.line(failure_usec)),
                       unit, tools, facts))
    if not rules.steps:
        # The rules know a restart cannot help: the program is missing, or
        # a cause out of the tools' reach already had its one restart.
        return [*offered, Plan(reason="no action")]
    restart = Step(tool="unit_restart", parameters={"unit": unit})
    offer(Plan(steps=(restart,), reason="restart it"))
    if facts.need_daemon_reload:
        offer(Plan(steps=(Step(tool="daemon_reload"), restart),
                   reason="systemd runs an old definition: reload, then restart"))
    if facts.cache_dirs:
        offer(Plan(steps=(Step(tool="clear_cache", parameters={"unit": unit}), restart),
                   reason="clear its cache, then restart"))
    offered.append(Plan(reason="no action"))
    return offered
