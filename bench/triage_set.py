"""A labelled set of failures for sentry's decide step, drawn from the
system tier's scenarios (tests/system/test_sentry_plans.py and
test_sentry_scenarios.py) and variations of them.

Each incident is the input findings.py takes (the trigger, contextd's
changes, the journal, systemd's facts) and the plan a careful admin would
run, named by its tools. `build()` turns it into what sentry offers the
model through the real rules: the findings' lines, the cause, the rules'
plan and plans.candidates' offer. Most incidents have the rules right;
some are the judgment the rules cannot make (a drop-in and a cache both
linked, the journal naming only one; a program missing because a drop-in
points at a new one).

The set is split once, by hand, into two halves with every finding kind on
both sides: TUNING (the first 33 incidents, on which decide.py's prompt and
its worked examples were tuned, and a few more) and HELD_OUT (`held_out`
is true: other units, paths, wordings and timings, never shown to the
prompt's author). The prompt may be tuned only on the tuning half; a
figure that is to predict unseen failures is the held-out half's. Add new
incidents to either half, keeping it balanced by kind; never move one.

Labels are what a careful admin would run among today's tools
(daemon_reload, unit_restart, revert_dropin, clear_cache, revert_config,
free_space where statvfs found the filesystem full, downgrade_package
where an upgrade of the package owning the program came before the start
that failed), or nothing. No tool
reverts a unit file, creates an account or repairs a state directory yet:
there a restart only repeats the failure, and nothing is right.

    python -m bench.triage_set     the set, with the rules' answer to each
"""

from dataclasses import dataclass, replace

from syntrop.sentry import findings, plans
from syntrop.sentry.decide import Evidence
from syntrop.sentry.findings import Cause, Change, Finding, Plan, UnitFacts

S = 1_000_000
#: The failure's time (realtime microseconds); the set's times are relative to it.
FAILURE = 1_800_000_000 * S
TOOLS = ("daemon_reload", "unit_restart", "revert_dropin", "clear_cache", "revert_config",
         "free_space", "downgrade_package")

REVERT = ("revert_dropin",)
REVERT_CONFIG = ("revert_config",)
DOWNGRADE = ("downgrade_package",)
CLEAR = ("clear_cache", "unit_restart")
FREE = ("free_space", "unit_restart")
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
    held_out: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """What sentry gives the model for an incident, and the rules' plan."""

    incident: Incident
    evidence: Evidence
    rules: Plan
    offered: list[Plan]
    cause: Cause
    found: list[Finding]

    @property
    def human_must(self) -> bool:
        """The rules act no further: a human must."""
        return not self.rules.steps

    @property
    def kind(self) -> str:
        """The rules' cause: the finding kind the incident is counted under."""
        return self.cause.kind

    def is_right(self, plan: Plan) -> bool:
        return tuple(step.tool for step in plan.steps) == self.incident.right

    def restart(self) -> Plan | None:
        """The plain restart, when it is offered."""
        return next((p for p in self.offered if tools(p) == RESTART), None)


def tools(plan: Plan) -> tuple[str, ...]:
    return tuple(step.tool for step in plan.steps)


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


def _bad_dropin(unit: str, name: str, line: str, runtime: bool = False,
                seconds: float = -10) -> Incident:
    change = _dropin(unit, name, seconds=seconds, runtime=runtime)
    return Incident(name=f"bad drop-in {name} ({unit})", unit=unit, trigger="job_failed",
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


def _stale(unit: str, program: str, journal: tuple[str, ...], seconds: float = -30) -> Incident:
    return Incident(name=f"stale definition ({unit})", unit=unit, trigger="state_failed",
                    changes=(Change(kind="unit_file", timestamp_usec=_at(seconds), unit=unit,
                                    path=f"/etc/systemd/system/{unit}"),),
                    journal=journal,
                    facts=UnitFacts(unit=unit, need_daemon_reload=True, exec_main_code=1,
                                    exec_main_status=203, exec_paths=(program,),
                                    missing_exec=(program,),
                                    fragment_path=f"/etc/systemd/system/{unit}"),
                    right=RELOAD)


def _cache(unit: str, directory: str, line: str, ran: float = 7200) -> Incident:
    return Incident(name=f"stale cache ({directory})", unit=unit, trigger="job_failed",
                    changes=(), journal=(line,),
                    facts=UnitFacts(unit=unit, cache_dirs=(directory,), exec_main_code=1,
                                    exec_main_status=1, active_enter_usec=_at(-ran)),
                    right=CLEAR)


def _transient(unit: str, line: str, signal: int = 11, old_dropin: bool = True,
               exited: int = 0) -> Incident:
    """Nothing changed that the unit did not run well with: it died once
    (killed by `signal`, or exited with status `exited`)."""
    changes = (_dropin(unit, "10-limits.conf", seconds=-900),) if old_dropin else ()
    return Incident(name=f"transient {'exit' if exited else 'crash'} ({unit})", unit=unit,
                    trigger="state_failed", changes=changes, journal=(line,),
                    facts=UnitFacts(unit=unit, active_enter_usec=_at(-600),
                                    inactive_exit_usec=_at(-601),
                                    exec_main_code=1 if exited else 2,
                                    exec_main_status=exited or signal),
                    right=RESTART)


def _config(unit: str, path: str, package: str | None, line: str,
            right: tuple[str, ...] = RESTART, seconds: float = -1) -> Incident:
    changes = [Change(kind="config", timestamp_usec=_at(seconds), unit=unit, path=path)]
    if package:
        changes.append(Change(kind="package", timestamp_usec=_at(seconds), path=path,
                              action="conffile", package=package))
    return Incident(name=f"config {'replaced' if package else 'edited'} ({path})", unit=unit,
                    trigger="state_failed", changes=tuple(changes), journal=(line,),
                    facts=UnitFacts(unit=unit, active_enter_usec=_at(-3600),
                                    inactive_exit_usec=_at(-3600), exec_main_code=1,
                                    exec_main_status=1),
                    right=right)


def _dropin_and_cache(unit: str, name: str, directory: str, lines: tuple[str, ...],
                      right: tuple[str, ...]) -> Incident:
    """A drop-in and a cache both linked: the journal says which broke it."""
    change = _dropin(unit, name)
    return Incident(name=f"drop-in {name} and cache, {'cache' if right == CLEAR else 'drop-in'}"
                         f" named ({unit})", unit=unit, trigger="job_failed", changes=(change,),
                    journal=lines,
                    facts=_restarted(unit, drop_in_paths=(change.path,),
                                     cache_dirs=(directory,)),
                    right=right)


def _missing(unit: str, name: str, program: str, lines: tuple[str, ...],
             right: tuple[str, ...], cache: str = "", named_by: bool = False) -> Incident:
    """A program missing, with a drop-in changed before the failing start:
    either the drop-in points the unit at a program that is not there
    (revert it; `named_by`: systemd's facts say its ExecStart= names it),
    or the program went away on its own (a human)."""
    change = _dropin(unit, name)
    return Incident(name=f"missing {program}, drop-in {name}", unit=unit, trigger="job_failed",
                    changes=(change,), journal=lines,
                    facts=_restarted(unit, drop_in_paths=(change.path,), exec_main_status=203,
                                     exec_paths=(program,), missing_exec=(program,),
                                     cache_dirs=(cache,) if cache else (),
                                     missing_named_by=((change.path, program),) if named_by
                                     else ()),
                    right=right)


def _gone(unit: str, program: str, lines: tuple[str, ...]) -> Incident:
    """A program missing with nothing changed that names it: a human."""
    return Incident(name=f"missing {program}, no change", unit=unit, trigger="state_failed",
                    changes=(), journal=lines,
                    facts=_restarted(unit, exec_main_status=203, exec_paths=(program,),
                                     missing_exec=(program,)),
                    right=NOTHING)


def _no_user(unit: str, user: str, program: str, days: float) -> Incident:
    """217/USER: the account the unit runs as does not exist; its unit file
    changed `days` ago and it ran well since. No tool creates accounts."""
    path = f"/etc/systemd/system/{unit}"
    return Incident(
        name=f"no account {user} ({unit})", unit=unit, trigger="state_failed",
        changes=(Change(kind="unit_file", timestamp_usec=_at(-days * 86400), unit=unit,
                        path=path),),
        journal=(f"{unit}: Failed to determine user credentials: No such process",
                 f"{unit}: Failed at step USER spawning {program}: No such process"),
        facts=UnitFacts(unit=unit, active_enter_usec=_at(-days * 43200),
                        inactive_exit_usec=_at(-1), exec_main_code=1, exec_main_status=217,
                        exec_paths=(program,), fragment_path=path),
        right=NOTHING)


def _disk_full(unit: str, line: str, ran: float = 86400, full: str | None = None
               ) -> Incident:
    """The journal says the disk is full: a restart writes to it again.
    `full`: the path statvfs found on a full filesystem, which free_space
    can make room on (then it, and a restart, is right)."""
    return Incident(name=f"disk full ({unit})", unit=unit, trigger="state_failed",
                    changes=(), journal=(line,),
                    facts=UnitFacts(unit=unit, active_enter_usec=_at(-ran),
                                    inactive_exit_usec=_at(-ran), exec_main_code=1,
                                    exec_main_status=1, full_paths=(full,) if full else ()),
                    right=FREE if full else NOTHING)


def _upgraded(unit: str, package: str, program: str, line: str, seconds: float = -30
              ) -> Incident:
    """An upgrade of the package that owns the unit's program (dpkg's file
    list says so) broke it: the restart after it fails. The version before
    it is in the package cache: downgrading is right."""
    change = Change(kind="package", timestamp_usec=_at(seconds), action="upgrade",
                    package=package, summary=f"upgrade {package} (dpkg)")
    return Incident(name=f"package upgraded ({package}, {unit})", unit=unit,
                    trigger="state_failed", changes=(change,), journal=(line,),
                    facts=_restarted(unit, exec_paths=(program,),
                                     program_packages=((package, program),)),
                    right=DOWNGRADE)


def _oom(unit: str, line: str, ran: float = 7200) -> Incident:
    """The kernel killed it for memory after a long run: one restart (the
    pressure may have passed), then a human."""
    return Incident(name=f"killed for memory ({unit})", unit=unit, trigger="state_failed",
                    changes=(), journal=(line,),
                    facts=UnitFacts(unit=unit, active_enter_usec=_at(-ran),
                                    inactive_exit_usec=_at(-ran), exec_main_code=2,
                                    exec_main_status=9, result="oom-kill"),
                    right=RESTART)


def _state(unit: str, directory: str, line: str) -> Incident:
    """The journal names a broken state directory: no tool repairs one."""
    return Incident(name=f"broken state ({directory})", unit=unit, trigger="state_failed",
                    changes=(), journal=(line,),
                    facts=UnitFacts(unit=unit, state_dirs=(directory,), exec_main_code=1,
                                    exec_main_status=1, active_enter_usec=_at(-5400),
                                    inactive_exit_usec=_at(-5400)),
                    right=NOTHING)


def _unit_file(unit: str, line: str, seconds: float = -20) -> Incident:
    """The unit file changed (and was reloaded) before the failing
    restart: no tool reverts a unit file, a restart repeats it."""
    path = f"/etc/systemd/system/{unit}"
    return Incident(name=f"unit file changed ({unit})", unit=unit, trigger="job_failed",
                    changes=(Change(kind="unit_file", timestamp_usec=_at(seconds), unit=unit,
                                    path=path),),
                    journal=(line,), facts=_restarted(unit, fragment_path=path),
                    right=NOTHING)


def _resource(unit: str, line: str) -> Incident:
    """A resource another process holds: a restart meets it again."""
    return Incident(name=f"resource taken ({unit})", unit=unit, trigger="state_failed",
                    changes=(), journal=(line,),
                    facts=UnitFacts(unit=unit, active_enter_usec=_at(-1800),
                                    inactive_exit_usec=_at(-1800), exec_main_code=1,
                                    exec_main_status=1),
                    right=NOTHING)


def _loop(unit: str, line: str, attempts: int, status: int = 1) -> Incident:
    return Incident(name=f"crash loop ({unit})", unit=unit, trigger="state_failed", changes=(),
                    journal=(line,),
                    facts=UnitFacts(unit=unit, active_enter_usec=_at(-1),
                                    inactive_exit_usec=_at(-1), exec_main_code=1,
                                    exec_main_status=status),
                    right=NOTHING, attempts=attempts)


def _dependency(unit: str, dependency: str, healed: bool = False) -> Incident:
    """A start lost to a failed dependency: wait while it fails; once it is
    back (sentry healed it), retry the start."""
    if healed:
        facts = UnitFacts(unit=unit, requires=(dependency,),
                          dependencies_down=((dependency, _at(-4)),))
    else:
        facts = UnitFacts(unit=unit, requires=(dependency,), failed_dependencies=(dependency,))
    return Incident(name=f"dependency {dependency} {'healed' if healed else 'failed'} ({unit})",
                    unit=unit, trigger="dependency_healed" if healed else "job_dependency",
                    changes=(), journal=(), facts=facts, right=RESTART if healed else NOTHING)


def _fail(unit: str, program: str) -> str:
    return f"{unit}: Failed to locate executable {program}: No such file or directory"


#: The half the prompt may be tuned on (its first 33: the set it was tuned on).
TUNING: tuple[Incident, ...] = (
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
    # A typo in a config edited a second before: a restart repeats it; the
    # edit is put back.
    _config("pl-edit.service", "/etc/pl-edit/pl-edit.conf", None,
            "pl-edit: parse error in /etc/pl-edit/pl-edit.conf line 3", REVERT_CONFIG),
    _config("scenario-app.service", "/etc/scenario-app/app.env", "syntrop-scenario-app",
            "scenario-app: environment changed, exiting"),
    _config("dns.service", "/etc/dns/zones.conf", "dns-server",
            "dns: zone example.org: unknown record type", NOTHING),
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
    # Added with the held-out half, for the kinds the first 33 lacked.
    _state("ledger.service", "/var/lib/ledger",
           "ledger: database /var/lib/ledger/ledger.db is malformed"),
    _unit_file("hooks.service", "hooks: unrecognized argument --workers=auto"),
    _resource("smtp.service", "smtp: bind 0.0.0.0:25: Address already in use"),
    _transient("poller.service", "poller: upstream 10.0.4.2:443: connection refused "
               "(will retry later)", old_dropin=False, exited=75),
    _no_user("archive.service", "archiver", "/usr/bin/archive-run", days=40),
    _disk_full("pgsql.service", 'pgsql: could not write to file "pg_wal/xlogtemp.2291": '
               "No space left on device"),
    _oom("indexer.service", "indexer.service: A process of this unit has been killed by the "
         "OOM killer."),
    # Added with free_space.
    _disk_full("render.service", "render: cannot create /var/cache/render/tile-88.png: "
               "No space left on device", full="/var/cache/render/tile-88.png"),
    # Added with downgrade_package.
    _upgraded("gateway.service", "gatewayd", "/usr/sbin/gatewayd",
              "gatewayd: unknown directive 'listen-compat' in /etc/gatewayd/gw.conf line 4"),
)

#: The held-out half: never shown to whoever tunes the prompt.
HELD_OUT: tuple[Incident, ...] = tuple(replace(incident, held_out=True) for incident in (
    _bad_dropin("billing.service", "30-flags.conf",
                "billing: error: unrecognized arguments: --fast-path", seconds=-45),
    _bad_dropin("gateway.service", "override.conf",
                "gateway: TLS_CERT=/etc/gw/cert.pem: file not readable", seconds=-4),
    _bad_dropin("scheduler.service", "40-cpu.conf",
                "scheduler: CPUAffinity 64-127 names no online CPU", runtime=True,
                seconds=-20),
    _bad_dropin("notify.service", "90-debug.conf",
                "notify: LOG_LEVEL must be one of debug,info,warn; got 'verbose'"),
    _new_unit_dropin("exporter.service", "50-port.conf",
                     "exporter: --web.listen-address: invalid port 'metrics'"),
    _missing("convert.service", "50-convert-v3.conf", "/usr/local/bin/convert-v3",
             (_fail("convert.service", "/usr/local/bin/convert-v3"),), REVERT, named_by=True),
    _missing("relay.service", "override.conf", "/opt/relay/bin/relayd-2",
             ("relay.service: Failed at step EXEC spawning /opt/relay/bin/relayd-2: "
              "No such file or directory",), REVERT, named_by=True),
    _missing("audit.service", "20-nice.conf", "/usr/sbin/auditd-lite",
             ("dpkg: removing auditd-lite (0.9-1) ...",
              _fail("audit.service", "/usr/sbin/auditd-lite")), NOTHING),
    _stale("ocr.service", "/opt/ocr/bin/ocr-2.0", (_fail("ocr.service", "/opt/ocr/bin/ocr-2.0"),),
           seconds=-120),
    _stale("webhook.service", "/usr/local/bin/webhookd",
           ("webhook.service: Failed at step EXEC spawning /usr/local/bin/webhookd: "
            "No such file or directory",), seconds=-8),
    _stale("mirror.service", "/srv/mirror/bin/mirror-sync", (), seconds=-300),
    _gone("chat.service", "/usr/bin/chatd", (_fail("chat.service", "/usr/bin/chatd"),)),
    _gone("vpn.service", "/usr/sbin/openvpn-gw",
          ("vpn.service: Failed at step EXEC spawning /usr/sbin/openvpn-gw: "
           "No such file or directory",)),
    _no_user("grafana-sync.service", "grafsync", "/opt/grafsync/bin/sync", days=200),
    _disk_full("influx.service", "influx: write failed: ENOSPC: no space left on device, "
               "open '/srv/influx/wal/000812.wal'", ran=3 * 86400),
    _disk_full("logship.service", "logship: cannot append to spool: disk full (0 bytes free)"),
    _disk_full("sync.service", "sync: write /var/lib/sync/journal.tmp failed: "
               "No space left on device", ran=7200, full="/var/lib/sync/journal.tmp"),
    _disk_full("metrics.service", "metrics: ENOSPC writing /var/cache/metrics/chunk-0042",
               ran=600, full="/var/cache/metrics/chunk-0042"),
    _oom("thumbnailer.service", "thumbnailer: Out of memory: Killed process 4121 (thumbnailer)",
         ran=3 * 3600),
    _config("nginx-edge.service", "/etc/nginx-edge/nginx.conf", None,
            'nginx-edge: unexpected "}" in /etc/nginx-edge/nginx.conf:41', REVERT_CONFIG,
            seconds=-6),
    _config("redis-cache.service", "/etc/redis-cache/redis.conf", None,
            "redis-cache: Bad directive or wrong number of arguments at line 112",
            REVERT_CONFIG, seconds=-3),
    _config("haproxy.service", "/etc/haproxy/haproxy.cfg", "haproxy",
            "haproxy: configuration changed on disk, exiting for a clean start"),
    _config("ntpd.service", "/etc/ntpd/ntp.conf", "ntp-server",
            "ntpd: line 7: 'restrict -6' is no longer supported", NOTHING),
    _dropin_and_cache("tiles.service", "20-threads.conf", "/var/cache/tiles",
                      ("tiles: failed to open /var/cache/tiles/meta.sqlite: "
                       "database disk image is malformed",), CLEAR),
    _dropin_and_cache("pkgindex.service", "override.conf", "/var/cache/pkgindex",
                      ("pkgindex: stale lock and half-written /var/cache/pkgindex/Packages.gz",),
                      CLEAR),
    _dropin_and_cache("avatar.service", "60-resize.conf", "/var/cache/avatar",
                      ("avatar: option ResizeMode=smart from 60-resize.conf is not valid",
                       "avatar: serving from /var/cache/avatar"), REVERT),
    _dropin_and_cache("docs.service", "10-env.conf", "/var/cache/docs",
                      ("docs: DOCS_ROOT must be absolute (10-env.conf)",), REVERT),
    _cache("fonts.service", "/var/cache/fonts",
           "fonts: /var/cache/fonts/fc-cache.bin: unexpected end of file", ran=600),
    _cache("wiki.service", "/var/cache/wiki",
           "wiki: refusing to start: /var/cache/wiki/parser.bin has version 7, want 9"),
    _state("mqtt.service", "/var/lib/mqtt",
           "mqtt: persistence file /var/lib/mqtt/mosquitto.db is corrupt"),
    _unit_file("indexer.service", "indexer: invalid --shards value 'all'", seconds=-50),
    _resource("pgbouncer.service", "pgbouncer: listen 127.0.0.1:6432: Address already in use"),
    _resource("aptcron.service", "aptcron: Could not get lock /var/lib/dpkg/lock-frontend. "
              "It is held by process 8812 (unattended-upgr)"),
    _transient("fetcher.service", "fetcher: connect to mirror.internal:8443: connection "
               "refused (will retry later)", exited=75),
    _transient("encoder.service", "encoder: out of memory: killed process 4412 (encoder)",
               signal=9),
    _transient("stream.service", "stream: fatal signal 11 in worker thread 3",
               old_dropin=False),
    _loop("kiosk.service", "kiosk: cannot open display :0", attempts=3, status=2),
    _dependency("reports.service", "postgresql.service"),
    _dependency("frontend.service", "backend.service", healed=True),
    _upgraded("mta.service", "mta-lite", "/usr/sbin/mta-lite",
              "mta-lite: fatal: unsupported option -q", seconds=-240),
    _upgraded("imgproc.service", "vips-worker", "/usr/bin/vips-worker",
              "vips-worker: symbol lookup error: /usr/bin/vips-worker: undefined symbol: "
              "vips_image_new_v2", seconds=-8),
))

INCIDENTS: tuple[Incident, ...] = TUNING + HELD_OUT


def build(incident: Incident) -> Offer:
    """The findings, the cause, the rules' plan and the candidates, by the
    rules' own code."""
    found = findings.find(incident.unit, incident.trigger, incident.changes,
                          list(incident.journal), incident.facts, FAILURE,
                          attempts=incident.attempts)
    cause = findings.cause(found, FAILURE)
    rules = plans.plan(cause, incident.unit, TOOLS, incident.facts,
                          restarted=incident.restarted)
    offered = plans.candidates(found, rules, cause, incident.unit, TOOLS, incident.facts,
                                  FAILURE)
    evidence = Evidence(unit=incident.unit, findings=[f.line(FAILURE) for f in found],
                        cause=cause.summary, journal=list(incident.journal))
    return Offer(incident=incident, evidence=evidence, rules=rules, offered=offered,
                 cause=cause, found=found)


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
