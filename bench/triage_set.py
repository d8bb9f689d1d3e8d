"""A labelled set of failures for sentry's decide step, drawn from the
system tier's scenarios (tests/system/test_sentry_plans.py and
test_sentry_scenarios.py) and variations of them.

Each incident is the input findings.py takes (the trigger, contextd's
changes, the journal, systemd's facts) and the plan a careful admin would
run, named by its tools. `build()` turns it into what sentry offers the
model through the real rules: the findings' lines, the cause, the rules'
plan and findings.candidates' offer. Most incidents have the rules right;
some are the judgment the rules cannot make (a drop-in and a cache both
linked, the journal naming only one; a program missing because a drop-in
points at a new one).

    python -m bench.triage_set     the set, with the rules' answer to each
"""

from dataclasses import dataclass, replace

from syntrop.sentry import findings
from syntrop.sentry.decide import Evidence
from syntrop.sentry.findings import Change, Plan, UnitFacts

S = 1_000_000
#: The failure's time (realtime microseconds); the set's times are relative to it.
FAILURE = 1_800_000_000 * S
TOOLS = ("daemon_reload", "unit_restart", "revert_dropin", "clear_cache")

REVERT = ("revert_dropin",)
CLEAR = ("clear_cache", "unit_restart")
RELOAD = ("daemon_reload", "unit_restart")
RESTART = ("unit_restart",)
NOTHING: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Incident:
    """One failure and its right plan (the tools, in order)."""

    name: str
    unit: str
    trigger: str
    changes: tuple[Change, ...]
    journal: tuple[str, ...]
    facts: UnitFacts
    right: tuple[str, ...]
    attempts: int = 0
    restarted: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """What sentry gives the model for an incident, and the rules' plan."""

    incident: Incident
    evidence: Evidence
    rules: Plan
    offered: list[Plan]

    @property
    def human_must(self) -> bool:
        """The rules act no further: a human must."""
        return not self.rules.steps

    def is_right(self, plan: Plan) -> bool:
        return tuple(step.tool for step in plan.steps) == self.incident.right


def _at(seconds: float) -> int:
    return FAILURE + int(seconds * S)


def _restarted(unit: str, **more: object) -> UnitFacts:
    """A unit that ran well for an hour; its restart 2 s before the
    failure failed at once with status 1."""
    facts = UnitFacts(unit=unit, active_enter_usec=_at(-3600), inactive_exit_usec=_at(-2),
                      exec_main_code=1, exec_main_status=1)
    return replace(facts, **more)  # type: ignore[arg-type]


def _dropin(unit: str, name: str, seconds: float = -10, runtime: bool = False) -> Change:
    base = "/run/systemd/system" if runtime else "/etc/systemd/system"
    return Change(kind="dropin", timestamp_usec=_at(seconds), unit=unit,
                  path=f"{base}/{unit}.d/{name}", action="modified")


def _bad_dropin(unit: str, name: str, line: str, runtime: bool = False) -> Incident:
    change = _dropin(unit, name, runtime=runtime)
    return Incident(name=f"bad drop-in {name}", unit=unit, trigger="job_failed",
                    changes=(change,), journal=(line,),
                    facts=_restarted(unit, drop_in_paths=(change.path,)), right=REVERT)


def _new_unit_dropin(unit: str, name: str, line: str) -> Incident:
    """As in the system tier: a unit installed and started, a bad drop-in,
    a restart: its new unit file is in the evidence too."""
    change = _dropin(unit, name, seconds=-2)
    return Incident(
        name=f"bad drop-in on a new unit ({unit})", unit=unit, trigger="state_failed",
        changes=(Change(kind="unit_file", timestamp_usec=_at(-3), unit=unit,
                        path=f"/etc/systemd/system/{unit}"), change),
        journal=(f"Started {unit} - scenario.", line,
                 f"{unit}: Main process exited, code=exited, status=3/NOTIMPLEMENTED",
                 f"{unit}: Failed with result 'exit-code'."),
        facts=UnitFacts(unit=unit, active_enter_usec=_at(-0.5), inactive_exit_usec=_at(-0.5),
                        drop_in_paths=(change.path or "",), exec_main_code=1, exec_main_status=3),
        right=REVERT)


def _stale(unit: str, program: str, journal: tuple[str, ...]) -> Incident:
    return Incident(name=f"stale definition ({unit})", unit=unit, trigger="state_failed",
                    changes=(Change(kind="unit_file", timestamp_usec=_at(-30), unit=unit,
                                    path=f"/etc/systemd/system/{unit}"),),
                    journal=journal,
                    facts=UnitFacts(unit=unit, need_daemon_reload=True, exec_main_code=1,
                                    exec_main_status=203, exec_paths=(program,),
                                    missing_exec=(program,),
                                    fragment_path=f"/etc/systemd/system/{unit}"),
                    right=RELOAD)


def _cache(unit: str, directory: str, line: str) -> Incident:
    return Incident(name=f"stale cache ({directory})", unit=unit, trigger="job_failed",
                    changes=(), journal=(line,),
                    facts=UnitFacts(unit=unit, cache_dirs=(directory,), exec_main_code=1,
                                    exec_main_status=1, active_enter_usec=_at(-7200)),
                    right=CLEAR)


def _transient(unit: str, line: str, signal: int = 11, old_dropin: bool = True) -> Incident:
    changes = (_dropin(unit, "10-limits.conf", seconds=-900),) if old_dropin else ()
    return Incident(name=f"transient crash ({unit})", unit=unit, trigger="state_failed",
                    changes=changes, journal=(line,),
                    facts=UnitFacts(unit=unit, active_enter_usec=_at(-600),
                                    inactive_exit_usec=_at(-601), exec_main_code=2,
                                    exec_main_status=signal),
                    right=RESTART)


def _config(unit: str, path: str, package: str | None, line: str) -> Incident:
    changes = [Change(kind="config", timestamp_usec=_at(-1), unit=unit, path=path)]
    if package:
        changes.append(Change(kind="package", timestamp_usec=_at(-1), path=path,
                              action="conffile", package=package))
    return Incident(name=f"config {'replaced' if package else 'edited'} ({path})", unit=unit,
                    trigger="state_failed", changes=tuple(changes), journal=(line,),
                    facts=UnitFacts(unit=unit, active_enter_usec=_at(-3600),
                                    inactive_exit_usec=_at(-3600), exec_main_code=1,
                                    exec_main_status=1),
                    right=RESTART)


def _dropin_and_cache(unit: str, name: str, directory: str, lines: tuple[str, ...],
                      right: tuple[str, ...]) -> Incident:
    """A drop-in and a cache both linked: the journal says which broke it."""
    change = _dropin(unit, name)
    return Incident(name=f"drop-in {name} and cache, {'cache' if right == CLEAR else 'drop-in'}"
                         " named", unit=unit, trigger="job_failed", changes=(change,),
                    journal=lines,
                    facts=_restarted(unit, drop_in_paths=(change.path,),
                                     cache_dirs=(directory,)),
                    right=right)


def _missing(unit: str, name: str, program: str, lines: tuple[str, ...],
             right: tuple[str, ...], cache: str = "") -> Incident:
    """A program missing, with a drop-in changed before the failing start:
    either the drop-in points the unit at a program that is not there
    (revert it), or the program went away on its own (a human)."""
    change = _dropin(unit, name)
    return Incident(name=f"missing {program}, drop-in {name}", unit=unit, trigger="job_failed",
                    changes=(change,), journal=lines,
                    facts=_restarted(unit, drop_in_paths=(change.path,), exec_main_status=203,
                                     exec_paths=(program,), missing_exec=(program,),
                                     cache_dirs=(cache,) if cache else ()),
                    right=right)


def _fail(unit: str, program: str) -> str:
    return f"{unit}: Failed to locate executable {program}: No such file or directory"


INCIDENTS: tuple[Incident, ...] = (
    _bad_dropin("web.service", "50-bad.conf", "web: unknown option --frobnicate"),
    _bad_dropin("api.service", "override.conf", "api: invalid value for PORT: 'eighty'"),
    _bad_dropin("queue.service", "20-memory.conf", "queue: cannot allocate 64G: out of memory"),
    _bad_dropin("proxy.service", "50-args.conf", "proxy: bad flag --listen=::1:99999",
                runtime=True),
    _bad_dropin("mail.service", "10-env.conf", "mail: MAIL_HOST is not set"),
    _new_unit_dropin("pl-dropin.service", "50-bad.conf", "pl-dropin: bad option"),
    _new_unit_dropin("worker.service", "override.conf", "worker: unknown setting Threads=x"),
    _stale("pl-reload.service", "/usr/local/bin/pl-reload-old", ()),
    _stale("app.service", "/usr/local/bin/app-1.2", (_fail("app.service",
                                                         "/usr/local/bin/app-1.2"),)),
    _stale("metrics.service", "/opt/metrics/bin/metricsd",
           ("metrics.service: Main process exited, code=killed, status=9/KILL",)),
    _cache("pl-cache.service", "/var/cache/pl-cache",
           "pl-cache: corrupt cache /var/cache/pl-cache/index.db"),
    _cache("search.service", "/var/cache/search",
           "search: index /var/cache/search/segments.gen is truncated"),
    _cache("thumbs.service", "/var/cache/thumbs",
           "thumbs: bad magic in /var/cache/thumbs/db.lmdb"),
    _transient("pl-crash.service", "pl-crash: segfault at 0000000000000010"),
    _transient("render.service", "render: killed by the OOM killer", signal=9,
               old_dropin=False),
    _transient("sync.service", "sync: lost connection to peer, exiting", signal=6),
    _config("pl-edit.service", "/etc/pl-edit/pl-edit.conf", None,
            "pl-edit: parse error in /etc/pl-edit/pl-edit.conf line 3"),
    _config("scenario-app.service", "/etc/scenario-app/app.env", "syntrop-scenario-app",
            "scenario-app: environment changed, exiting"),
    _config("dns.service", "/etc/dns/zones.conf", "dns-server",
            "dns: zone example.org: unknown record type"),
    _dropin_and_cache("index.service", "50-log.conf", "/var/cache/index",
                      ("index: corrupt index /var/cache/index/index.db",), CLEAR),
    _dropin_and_cache("feed.service", "override.conf", "/var/cache/feed",
                      ("feed: checksum mismatch in /var/cache/feed/items.bin",), CLEAR),
    _dropin_and_cache("geo.service", "10-nice.conf", "/var/cache/geo",
                      ("geo: cannot read /var/cache/geo/tiles.idx: bad header",), CLEAR),
    _dropin_and_cache("blob.service", "50-bad.conf", "/var/cache/blob",
                      ("blob: unknown option --cache-mode=fast in "
                       "/etc/systemd/system/blob.service.d/50-bad.conf",
                       "blob: cache at /var/cache/blob"), REVERT),
    _dropin_and_cache("cdn.service", "override.conf", "/var/cache/cdn",
                      ("cdn: using cache /var/cache/cdn",
                       "cdn: invalid ExecStart argument from "
                       "/etc/systemd/system/cdn.service.d/override.conf"), REVERT),
    _missing("report.service", "50-report-v2.conf", "/usr/local/bin/report-v2",
             (_fail("report.service", "/usr/local/bin/report-v2"),), REVERT),
    _missing("ingest.service", "override.conf", "/opt/ingest/bin/ingest-next",
             ("ingest.service: override.conf sets ExecStart=/opt/ingest/bin/ingest-next",
              _fail("ingest.service", "/opt/ingest/bin/ingest-next")), REVERT),
    _missing("media.service", "60-media-new.conf", "/usr/local/bin/media-new",
             (_fail("media.service", "/usr/local/bin/media-new"),), REVERT),
    _missing("ldap.service", "10-log-level.conf", "/usr/sbin/slapd",
             ("dpkg: removing slapd (2.5.13) ...", _fail("ldap.service", "/usr/sbin/slapd")),
             NOTHING),
    _missing("backup.service", "20-nice.conf", "/usr/bin/backupd",
             ("apt: Remove: backupd:amd64 (3.1-2)", _fail("backup.service", "/usr/bin/backupd")),
             NOTHING),
    _missing("print.service", "10-env.conf", "/usr/sbin/cupsd",
             ("print: program /usr/sbin/cupsd deleted by an admin",
              _fail("print.service", "/usr/sbin/cupsd")), NOTHING),
    _missing("tile.service", "10-limits.conf", "/usr/bin/tiled",
             ("dpkg: removing tiled (1.0) ...", "tile: cache at /var/cache/tile"), NOTHING,
             cache="/var/cache/tile"),
    Incident(name="crash loop", unit="pl-loop.service", trigger="state_failed", changes=(),
             journal=("pl-loop: exiting at once",),
             facts=UnitFacts(unit="pl-loop.service", active_enter_usec=_at(-1),
                             inactive_exit_usec=_at(-1), exec_main_code=1, exec_main_status=1),
             right=NOTHING, attempts=2),
    Incident(name="dependency failed", unit="pl-dependent.service", trigger="job_dependency",
             changes=(), journal=(),
             facts=UnitFacts(unit="pl-dependent.service", requires=("pl-dep.service",),
                             failed_dependencies=("pl-dep.service",)),
             right=NOTHING),
)


def build(incident: Incident) -> Offer:
    """The findings, the cause, the rules' plan and the candidates, by the
    rules' own code."""
    found = findings.find(incident.unit, incident.trigger, incident.changes,
                          list(incident.journal), incident.facts, FAILURE,
                          attempts=incident.attempts)
    cause = findings.cause(found, FAILURE)
    rules = findings.plan(cause, incident.unit, TOOLS, incident.facts,
                          restarted=incident.restarted)
    offered = findings.candidates(found, rules, cause, incident.unit, TOOLS, incident.facts,
                                  FAILURE)
    evidence = Evidence(unit=incident.unit, findings=[f.line(FAILURE) for f in found],
                        cause=cause.summary, journal=list(incident.journal))
    return Offer(incident=incident, evidence=evidence, rules=rules, offered=offered)


def offers() -> list[Offer]:
    return [build(incident) for incident in INCIDENTS]


def main() -> None:
    every = offers()
    for offer in every:
        print(f"{offer.incident.name:48} rules {offer.rules.describe():28} "
              f"right {' → '.join(offer.incident.right) or 'nothing':28} "
              f"{'ok ' if offer.is_right(offer.rules) else 'BAD'} "
              f"offered {[p.describe() for p in offer.offered]}")
    right = sum(o.is_right(o.rules) for o in every)
    print(f"{len(every)} incidents; the rules right in {right}; "
          f"a human must in {sum(o.human_must for o in every)}")


if __name__ == "__main__":
    main()
