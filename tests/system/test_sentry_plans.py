"""systemd-sentry's plans under a real systemd, one scenario per tool and per
kind of cause, each next to plain `Restart=on-failure` where that says
something: what the incident names as the cause, the exact plan that ran
(toold's audit agrees), the unit's final state, and that nothing else on
the host changed (checksums of /etc, /run/systemd/system, /var/cache and
/usr/local/bin, the scenario's own files aside).

- a stale definition (the unit file fixed on disk, systemd still running
  the old one whose program is gone): daemon_reload → unit_restart;
- a corrupt cache the journal names: clear_cache → unit_restart;
- a dependency whose bad drop-in failed the start of a unit that Requires
  it: the dependency's drop-in is reverted, the dependent's own benign
  drop-in is left alone, and the dependent's lost start is retried;
- a config file edited by hand: put back (revert_config);
- a full filesystem the journal names: free_space → unit_restart;
- an upgrade of the package owning the unit's program: downgrade_package
  (the previous version from the package cache);
- a missing program: named, no action, a human;
- a unit that dies a second after each start: never recorded healed;
- a benign drop-in the unit ran well with, then a crash: restarted, the
  drop-in reported and kept;
- a protected unit: an incident that says so, nothing done.

runtimed has no model here: the rules plan (test_sentry_scenarios.py has
the model deciding). `pytest -s` prints the table docs/sentry.md records.
"""

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import declared_error
from tests.system.instance import Instance, wait_until

SENTRY = "io.syntrop.Sentry1"
CONTEXT = "io.syntrop.Context1"
TOOL = "io.syntrop.Tool1"
CONFIG = ('ignore = ["cmp-*"]\nprotected = ["pl-prot-*"]\n[budgets]\ndecide = 20\n'
          "[breaker]\ncap = 2\nbase_sec = 1\nmax_sec = 1\n")
#: (scenario, supervisor, healed, failure → healthy, what was done)
RESULTS: list[tuple[str, str, str, str, str]] = []
RESTART = ("Restart=on-failure\nRestartSec=200ms\n[Unit]\nStartLimitIntervalSec=30\n"
           "StartLimitBurst=3\n")
WATCHED = ("/etc", "/run/systemd/system", "/var/cache", "/usr/local/bin")


def call(instance: Instance, method: str, interface: str = SENTRY, **params: Any) -> Any:
    return instance.call(interface, method, **params)


@pytest.fixture(scope="module")
def sentry(instance: Instance) -> Iterator[Instance]:
    instance.write("/etc/syntrop/toold.toml", "[timeouts]\nhealth_window_sec = 1\njob_sec = 20\n")
    instance.systemctl("stop", "toold.service", check=False)
    call(instance, "GetStatus", interface=CONTEXT)  # contextd watching before any edit
    instance.write("/etc/syntrop/sentry.toml", CONFIG)
    instance.systemctl("restart", "systemd-sentry.service")
    instance.wait_for_unit("systemd-sentry.service", ActiveState="active")
    assert call(instance, "GetStatus")["subscribed"] is True
    yield instance
    print("\n| scenario | supervisor | healed | failure → healthy | what was done |\n"
          "| --- | --- | --- | --- | --- |")
    for row in RESULTS:
        print("| " + " | ".join(row) + " |")
    instance.systemctl("stop", "systemd-sentry.service", check=False)
    instance.run(["rm", "-f", "/etc/syntrop/sentry.toml", "/etc/syntrop/toold.toml"],
                 check=False)


# --- helpers ----------------------------------------------------------------------

def install(instance: Instance, unit: str, body: str, unit_section: str = "") -> None:
    instance.write(f"/etc/systemd/system/{unit}",
                   f"[Unit]\nDescription=sentry plan scenario\n{unit_section}"
                   f"[Service]\nType=exec\n{body}")
    instance.systemctl("daemon-reload")


def program(instance: Instance, path: str, script: str) -> None:
    instance.write(path, "#!/bin/sh\n" + script)
    instance.run(["chmod", "755", path])


def snapshot(instance: Instance) -> dict[str, str]:
    """sha256 of every file under WATCHED (syntrop's own configuration and
    caches aside: the tests and the daemons write those)."""
    out = instance.run(["sh", "-c", "find " + " ".join(WATCHED) + " -xdev -type f "
                        "! -path '/etc/syntrop/*' ! -path '/var/cache/private/*' "
                        "! -path '/var/cache/syntrop/*' "
                        "! -path '/etc/ld.so.cache' -print0 | xargs -0 -r sha256sum"],
                       timeout=120).stdout
    return {line[66:]: line[:64] for line in out.splitlines() if len(line) > 66}


def changed(before: dict[str, str], after: dict[str, str], *own: str) -> set[str]:
    """Paths added, removed or changed, but for those under `own`."""
    paths = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    return {p for p in paths if not any(p == o or p.startswith(o.rstrip("/") + "/")
                                         for o in own)}


def incidents(instance: Instance, unit: str, count: int, timeout: float = 90,
              ) -> list[dict[str, Any]]:
    """At least `count` finished incidents of `unit`, oldest first."""
    def done() -> list[dict[str, Any]]:
        found = call(instance, "ListIncidents", unit=unit)["incidents"]
        ended = [i for i in found if i["result"] != "in_progress"]
        return sorted(ended, key=lambda i: i["detected_usec"]) if len(ended) >= count else []

    return wait_until(f"{count} finished incidents of {unit}", done, timeout, interval=0.1)


def audited(instance: Instance, unit: str) -> list[str]:
    """The tools toold ran on `unit` (allowed, not dry runs), in order."""
    records = call(instance, "GetAudit", interface=TOOL, limit=1000, unit=unit)["records"]
    return [r["tool"] for r in records if r["decision"] == "allowed" and not r["dry_run"]]


def plan_of(incident: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["tool"], s["outcome"]) for s in incident.get("plan") or []]


def took(incident: dict[str, Any]) -> float:
    """From the failure signal to the end of the plan (the unit active)."""
    [execute] = [p for p in incident["phases"] if p["name"] == "execute"]
    seconds: float = (execute["started_usec"] + execute["duration_usec"]
                      - incident["detected_usec"]) / 1e6
    return seconds


def record(scenario: str, incident: dict[str, Any],
           since: dict[str, Any] | None = None) -> None:
    """A row of the table; `since`: an earlier incident of the same
    failure (a dependent's wait), timed from its failure."""
    plan = " → ".join(t for t, _ in plan_of(incident)) or "nothing"
    cause = incident["cause"]["kind"] if incident.get("cause") else "-"
    healed = incident["result"] == "healed"
    seconds = took(incident) + (incident["detected_usec"] - since["detected_usec"]) / 1e6 \
        if since else took(incident)
    RESULTS.append((scenario, "sentry", "yes" if healed else f"no ({incident['result']})",
                    f"{seconds:.2f} s" if healed else "-", f"cause {cause}; {plan}"))


def restart_on_failure_heals(instance: Instance, unit: str, within: float = 9,
                             hold: float = 5) -> bool:
    """Whether a unit with Restart=on-failure stays active for `hold`
    seconds on end (sentry's own minimum) within `within` seconds, sampled
    every 0.1 s: a unit that flaps is not healed."""
    deadline = time.monotonic() + within
    since: float | None = None
    while time.monotonic() < deadline:
        now = time.monotonic()
        if instance.show(unit, "ActiveState")["ActiveState"] != "active":
            since = None
        elif since is None:
            since = now
        elif now - since >= hold:
            return True
        time.sleep(0.1)
    return False


def compare(scenario: str, instance: Instance, unit: str) -> None:
    healed = restart_on_failure_heals(instance, unit)
    shown = instance.show(unit, "ActiveState", "NRestarts", "Result")
    RESULTS.append((scenario, "Restart=on-failure", "yes" if healed else "no", "-",
                    f"{shown['NRestarts']} restarts; {shown['ActiveState']} ({shown['Result']})"))
    instance.systemctl("stop", unit, check=False)
    instance.systemctl("reset-failed", unit, check=False)


# --- daemon_reload → unit_restart ---------------------------------------------------

def stale_definition(instance: Instance, unit: str, restart: str = "") -> None:
    """The unit runs /usr/local/bin/<unit>-old; an admin installs <unit>-new,
    points the unit file at it and removes the old program, without
    daemon-reload; then the running process dies."""
    name = unit.removesuffix(".service")
    program(instance, f"/usr/local/bin/{name}-old", "exec sleep infinity\n")
    program(instance, f"/usr/local/bin/{name}-new", "exec sleep infinity\n")
    install(instance, unit, f"ExecStart=/usr/local/bin/{name}-old\n{restart}")
    instance.systemctl("start", unit)
    instance.wait_for_unit(unit, ActiveState="active")
    instance.write(f"/etc/systemd/system/{unit}",
                   "[Unit]\nDescription=sentry plan scenario\n[Service]\nType=exec\n"
                   f"ExecStart=/usr/local/bin/{name}-new\n{restart}")
    instance.run(["rm", f"/usr/local/bin/{name}-old"])
    instance.systemctl("kill", "--signal=KILL", unit)


def test_a_stale_definition_is_reloaded_then_restarted(sentry: Instance) -> None:
    unit = "pl-reload.service"
    before = snapshot(sentry)
    stale_definition(sentry, unit)
    [incident] = incidents(sentry, unit, 1)
    assert incident["cause"]["kind"] == "stale_definition", incident
    assert plan_of(incident) == [("daemon_reload", "succeeded"), ("unit_restart", "succeeded")]
    assert incident["result"] == "healed", incident
    assert audited(sentry, unit) == ["unit_restart"]  # daemon_reload has no unit
    shown = sentry.show(unit, "ActiveState", "NeedDaemonReload", "ExecMainPID")
    assert shown["ActiveState"] == "active" and shown["NeedDaemonReload"] == "no"
    assert changed(before, snapshot(sentry), f"/etc/systemd/system/{unit}",
                   "/usr/local/bin/pl-reload-old", "/usr/local/bin/pl-reload-new") == set()
    record("stale definition", incident)
    sentry.systemctl("stop", unit)


def test_restart_on_failure_keeps_running_the_stale_definition(sentry: Instance) -> None:
    unit = "cmp-reload.service"
    stale_definition(sentry, unit, RESTART)
    compare("stale definition", sentry, unit)


# --- clear_cache → unit_restart ------------------------------------------------------

def corrupt_cache(instance: Instance, unit: str, restart: str = "") -> str:
    """A service that refuses a corrupt index in its CacheDirectory=, saying
    so on stderr (the journal); the index is corrupted, the service
    restarted. Returns the cache directory."""
    name = unit.removesuffix(".service")
    cache = f"/var/cache/{name}"
    program(instance, f"/usr/local/bin/{name}",
            f'if grep -q corrupt {cache}/index 2>/dev/null; then\n'
            f'  echo "{name}: corrupt cache file {cache}/index, refusing to start" >&2\n'
            "  exit 1\nfi\nexec sleep infinity\n")
    install(instance, unit, f"ExecStart=/usr/local/bin/{name}\nCacheDirectory={name}\n{restart}")
    instance.systemctl("start", unit)
    instance.wait_for_unit(unit, ActiveState="active")
    instance.write(f"{cache}/index", "corrupt\n")
    instance.systemctl("restart", unit, check=False)
    return cache


def test_a_cache_the_journal_names_is_cleared_then_restarted(sentry: Instance) -> None:
    unit = "pl-cache.service"
    before = snapshot(sentry)
    cache = corrupt_cache(sentry, unit)
    [incident] = incidents(sentry, unit, 1)
    assert (incident["cause"]["kind"], incident["cause"]["subject"]) == ("stale_cache", cache)
    assert any("corrupt cache file" in line for line in incident["cause"]["evidence"])
    assert plan_of(incident) == [("clear_cache", "succeeded"), ("unit_restart", "succeeded")]
    assert incident["result"] == "healed", incident
    assert audited(sentry, unit) == ["clear_cache", "unit_restart"]
    assert not sentry.host_path(f"{cache}/index").exists()
    assert changed(before, snapshot(sentry), f"/etc/systemd/system/{unit}",
                   "/usr/local/bin/pl-cache", cache) == set()
    record("corrupt cache", incident)
    sentry.systemctl("stop", unit)


def test_restart_on_failure_cannot_clear_a_cache(sentry: Instance) -> None:
    unit = "cmp-cache.service"
    corrupt_cache(sentry, unit, RESTART)
    compare("corrupt cache", sentry, unit)


# --- a dependency ------------------------------------------------------------------

def broken_dependency(instance: Instance, db: str, app: str, restart: str = "") -> tuple[str, str]:
    """`app` Requires= and After= `db`; app has a benign drop-in (loaded,
    never run with); db gets a bad one that fails its start; starting app
    then fails with job result `dependency`. Returns both drop-ins' paths."""
    install(instance, db, f"ExecStart=/bin/sleep infinity\n{restart}")
    install(instance, app, f"ExecStart=/bin/sleep infinity\n{restart}",
            unit_section=f"Requires={db}\nAfter={db}\n")
    benign = f"/etc/systemd/system/{app}.d/10-env.conf"
    instance.write(benign, "[Service]\nEnvironment=GREETING=hello\n")
    bad = f"/etc/systemd/system/{db}.d/50-bad.conf"
    # A start that fails (not a process that dies later): only a failed
    # start job gives the dependent's job the result `dependency`.
    instance.write(bad, "[Service]\nExecStartPre=/bin/sh -c 'echo bad setting >&2; exit 3'\n")
    for path in (benign, bad):
        def recorded(path: str = path) -> bool:
            return any(e.get("path") == path
                       for e in call(instance, "ListEvents", interface=CONTEXT,
                                     kind="dropin")["events"])
        wait_until(f"contextd recorded {path}", recorded, 10)
    instance.systemctl("daemon-reload")
    instance.systemctl("start", app, check=False)
    return benign, bad


def test_a_dependency_is_healed_and_the_dependents_start_retried(sentry: Instance) -> None:
    db, app = "pl-db.service", "pl-app.service"
    before = snapshot(sentry)
    benign, bad = broken_dependency(sentry, db, app)
    [db_incident] = [i for i in incidents(sentry, db, 1) if i["result"] != "breaker_open"]
    wait_until(f"{app} active", lambda: sentry.show(app, "ActiveState")["ActiveState"] ==
               "active", 60)
    app_incidents = wait_until(f"{app} healed", lambda: [
        i for i in incidents(sentry, app, 1) if i["result"] == "healed"] and
        incidents(sentry, app, 1), 30)
    assert db_incident["cause"]["kind"] == "dropin_changed" and \
        db_incident["cause"]["subject"] == bad, db_incident
    assert plan_of(db_incident) == [("revert_dropin", "succeeded")]
    assert db_incident["result"] == "healed"
    first, last = app_incidents[0], app_incidents[-1]
    assert first["trigger"] == "job_dependency"
    assert (first["cause"]["kind"], first["cause"]["subject"]) == ("dependency_failed", db)
    if first["result"] == "waiting":  # db was still failed: app waited for it
        assert last["trigger"] == "dependency_healed", app_incidents
    else:  # sentry had healed db before app's turn came
        assert first is last, app_incidents
    assert last["cause"]["kind"] == "dependency_failed"
    assert all(t == "unit_restart" for t in audited(sentry, app))  # never a revert of app
    assert last["result"] == "healed" and plan_of(last) == [("unit_restart", "succeeded")]
    assert sentry.host_path(benign).exists() and not sentry.host_path(bad).exists()
    assert sentry.show(db, "ActiveState")["ActiveState"] == "active"
    assert changed(before, snapshot(sentry), f"/etc/systemd/system/{db}",
                   f"/etc/systemd/system/{app}", benign, bad,
                   f"/etc/systemd/system/{db}.d", f"/etc/systemd/system/{app}.d") == set()
    record("a dependency failed (bad drop-in)", db_incident)
    record("… its dependent's lost start", last, since=first)
    sentry.systemctl("stop", app, db)


def test_restart_on_failure_cannot_heal_through_a_dependency(sentry: Instance) -> None:
    db, app = "cmp-db.service", "cmp-app.service"
    broken_dependency(sentry, db, app, RESTART)
    compare("a dependency failed (bad drop-in)", sentry, app)
    sentry.systemctl("stop", db, check=False)


# --- causes out of reach --------------------------------------------------------

def test_a_config_edited_by_hand_is_put_back(sentry: Instance) -> None:
    """An admin's edit of the unit's EnvironmentFile= broke its start: the
    rules plan toold's revert_config (the file back to its content before
    contextd's latest record), and the unit heals; before revert_config it
    got one restart, then a human."""
    unit = "pl-conf.service"
    env = config_edited(sentry, unit)
    before = snapshot(sentry)
    sentry.systemctl("restart", unit, check=False)
    [incident] = incidents(sentry, unit, 1)
    assert (incident["cause"]["kind"], incident["cause"].get("subject")) == \
        ("config_edited", env), json.dumps(
            {k: incident.get(k) for k in ("cause", "findings", "phases")})
    assert "the start that failed began after it" in incident["cause"]["evidence"]
    assert [tool for tool, _ in plan_of(incident)] == ["revert_config"]
    assert incident["result"] == "healed", incident
    sentry.wait_for_unit(unit, ActiveState="active")
    assert audited(sentry, unit) == ["revert_config"]
    assert sentry.host_path(env).read_text() == "MODE=good\n"
    assert changed(before, snapshot(sentry), env) == set()  # the one file put back
    record("a config file edited by hand", incident)
    sentry.systemctl("stop", unit, check=False)


def test_a_full_filesystem_is_freed_then_restarted(sentry: Instance) -> None:
    """A 256 KiB filesystem holds the unit's spool (/srv/pl-full) and its
    cache (/var/cache/pl-full), both bound from one tmpfs; leftovers in the
    cache fill it, and the next start cannot write its spool file: "No
    space left on device". statvfs finds the named path's filesystem full;
    the rules plan toold's free_space (the unit's cache is on that
    filesystem) and a restart, and the unit heals; nothing outside the
    cache changed."""
    unit = "pl-full.service"
    disk, cache, spool = "/mnt/pl-full", "/var/cache/pl-full", "/srv/pl-full"
    program(sentry, "/usr/local/bin/pl-full",
            f"if ! head -c 65536 /dev/zero > {spool}/work.tmp 2>/dev/null; then\n"
            f'  echo "pl-full: cannot write {spool}/work.tmp: No space left on device" >&2\n'
            "  exit 1\nfi\nexec sleep infinity\n")
    install(sentry, unit, "ExecStart=/usr/local/bin/pl-full\nCacheDirectory=pl-full\n")
    sentry.run(["mkdir", "-p", disk, cache, spool])
    sentry.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "pl-full", disk])
    sentry.run(["mkdir", f"{disk}/cache", f"{disk}/spool"])
    sentry.run(["mount", "--bind", f"{disk}/cache", cache])
    sentry.run(["mount", "--bind", f"{disk}/spool", spool])
    # The instance's mounts are private, so a service's namespace sees only
    # what was mounted before it started (on a host, / is shared and a new
    # mount reaches them): sentry and toold start again after these.
    sentry.systemctl("stop", "toold.service")
    sentry.systemctl("restart", "systemd-sentry.service")
    sentry.wait_for_unit("systemd-sentry.service", ActiveState="active")
    wait_until("sentry subscribed", lambda: call(sentry, "GetStatus")["subscribed"], 20)
    try:
        sentry.systemctl("start", unit)
        sentry.wait_for_unit(unit, ActiveState="active")
        before = snapshot(sentry)
        sentry.run(["sh", "-c", f"rm -f {spool}/work.tmp; "
                                f"dd if=/dev/zero of={cache}/left.bin bs=4k 2>/dev/null; true"])
        sentry.systemctl("restart", unit, check=False)
        [incident] = incidents(sentry, unit, 1)
        assert (incident["cause"]["kind"], incident["cause"]["subject"]) == \
            ("disk_full", f"{spool}/work.tmp"), incident["cause"]
        assert plan_of(incident) == [("free_space", "succeeded"), ("unit_restart", "succeeded")]
        assert incident["result"] == "healed", incident
        assert audited(sentry, unit) == ["free_space", "unit_restart"]
        # The tmpfs is mounted in the instance only: look from inside it.
        assert sentry.run(["ls", "-A", cache]).stdout.split() == []
        assert sentry.run(["ls", "-A", spool]).stdout.split() == ["work.tmp"]
        assert changed(before, snapshot(sentry), cache, spool) == set()
        record("a full filesystem", incident)
    finally:
        sentry.systemctl("stop", unit, check=False)
        for mount in (spool, cache, disk):
            sentry.run(["umount", mount], check=False)


def build_deb(instance: Instance, package: str, version: str, script: str) -> str:
    """A tiny .deb of `package` holding /usr/bin/PACKAGE (`script`), built
    inside the instance with dpkg-deb and put in the package cache; its
    path there."""
    root = f"/tmp/{package}-{version}"
    instance.write(f"{root}/DEBIAN/control",
                   f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
                   "Maintainer: syntrop tests <root@localhost>\n"
                   "Description: a sentry plan scenario\n")
    program(instance, f"{root}/usr/bin/{package}", script)
    deb = f"/var/cache/apt/archives/{package}_{version}_all.deb"
    instance.run(["mkdir", "-p", "/var/cache/apt/archives"])
    instance.run(["dpkg-deb", "--root-owner-group", "--build", root, deb], timeout=60)
    return deb


def test_an_upgraded_package_is_downgraded_from_the_cache(sentry: Instance) -> None:
    """pl-tool 1.0 runs; 2.0, installed by dpkg, refuses an option its
    unit passes, so the restart after the upgrade fails. contextd read the
    upgrade from dpkg's log, dpkg's file list says pl-tool owns the unit's
    program: the rules plan toold's downgrade_package, which installs 1.0
    from the package cache (dpkg run by PID 1 in a transient unit) and
    restarts the unit; it heals, and dpkg says 1.0 after. Before
    downgrade_package it got one restart, then a human."""
    unit, package = "pl-pkg.service", "pl-tool"
    old = build_deb(sentry, package, "1.0", "exec sleep infinity\n")
    new = build_deb(sentry, package, "2.0",
                    'echo "pl-tool: unsupported option --serve" >&2\nexit 1\n')
    sentry.run(["dpkg", "--install", old], timeout=120)
    install(sentry, unit, f"ExecStart=/usr/bin/{package} --serve\n")
    try:
        sentry.systemctl("start", unit)
        sentry.wait_for_unit(unit, ActiveState="active")
        time.sleep(1.5)  # dpkg's log has whole seconds: the upgrade comes after the start
        sentry.run(["dpkg", "--install", new], timeout=120)
        wait_until("contextd saw the upgrade", lambda: [
            e for e in call(sentry, "ListEvents", interface=CONTEXT, kind="package",
                            limit=100)["events"]
            if e.get("package") == package and e.get("action") == "upgrade"], 30)
        sentry.systemctl("restart", unit, check=False)
        [incident] = incidents(sentry, unit, 1)
        assert (incident["cause"]["kind"], incident["cause"].get("package")) == \
            ("package_upgraded", package), json.dumps(
                {k: incident.get(k) for k in ("cause", "findings", "phases", "plan")})
        assert plan_of(incident) == [("downgrade_package", "succeeded")], incident
        assert incident["result"] == "healed", incident
        sentry.wait_for_unit(unit, ActiveState="active")
        assert audited(sentry, unit) == ["downgrade_package"]
        version = sentry.run(["dpkg-query", "-W", "-f", "${Version}", package]).stdout
        assert version == "1.0"
        record("a package upgrade", incident)
    finally:
        sentry.systemctl("stop", unit, check=False)
        sentry.run(["dpkg", "--purge", package], check=False, timeout=120)
        sentry.run(["rm", "-rf", old, new, f"/tmp/{package}-1.0", f"/tmp/{package}-2.0"],
                   check=False)


def test_a_downgrade_that_makes_the_unit_worse_is_rolled_back(sentry: Instance) -> None:
    """toold alone (sentry ignores cmp-* units): pl-roll 2.0 runs, 1.0
    fails, so downgrade_package puts 1.0 in, sees the unit worse and
    installs 2.0 again from the cache (rolled_back). With 2.0's .deb gone
    nothing can put it back: failed, saying so; with no older .deb at all,
    NoPreviousVersion and nothing done."""
    unit, package = "cmp-pkg-roll.service", "pl-roll"
    old = build_deb(sentry, package, "1.0",
                    'echo "pl-roll: 1.0 cannot read the 2.0 state" >&2\nexit 1\n')
    new = build_deb(sentry, package, "2.0", "exec sleep infinity\n")
    sentry.run(["dpkg", "--install", new], timeout=120)
    install(sentry, unit, f"ExecStart=/usr/bin/{package}\n")

    def execute() -> Any:
        return call(sentry, "Execute", interface=TOOL, tool="downgrade_package",
                    parameters={"unit": unit, "package": package}, dry_run=False)

    def version() -> str:
        return str(sentry.run(["dpkg-query", "-W", "-f", "${Version}", package]).stdout)

    try:
        sentry.systemctl("start", unit)
        sentry.wait_for_unit(unit, ActiveState="active")
        dry = call(sentry, "Execute", interface=TOOL, tool="downgrade_package",
                   parameters={"unit": unit, "package": package}, dry_run=True)
        assert dry["outcome"] == "not_run" and "install pl-roll 1.0" in dry["plan"][0], dry
        result = execute()
        assert (result["outcome"], result["rolled_back"]) == ("rolled_back", True), result
        assert version() == "2.0"
        sentry.wait_for_unit(unit, ActiveState="active")
        sentry.run(["rm", "-f", new])
        result = execute()
        assert (result["outcome"], result["rolled_back"]) == ("failed", False), result
        assert "is not in /var/cache/apt/archives" in result["message"], result
        assert version() == "1.0"
        sentry.run(["rm", "-f", old])
        error, fields = declared_error(execute)
        assert (error, fields) == (f"{TOOL}.NoPreviousVersion", {
            "unit": unit, "reason": "no previous version in the package cache"})
        assert version() == "1.0"
    finally:
        sentry.systemctl("stop", unit, check=False)
        sentry.run(["dpkg", "--purge", package], check=False, timeout=120)
        sentry.run(["rm", "-rf", old, new, f"/tmp/{package}-1.0", f"/tmp/{package}-2.0"],
                   check=False)


def config_edited(instance: Instance, unit: str, restart: str = "") -> str:
    """A service reading MODE from its EnvironmentFile=, which an admin
    edits to a value it refuses; then it is restarted. Returns the file."""
    name = unit.removesuffix(".service")
    env = f"/etc/{name}/app.env"
    instance.write(env, "MODE=good\n")
    program(instance, f"/usr/local/bin/{name}",
            f'[ "$MODE" = good ] || {{ echo "{name}: MODE=$MODE is not good" >&2; exit 2; }}\n'
            "exec sleep infinity\n")
    install(instance, unit, f"EnvironmentFile={env}\nExecStart=/usr/local/bin/{name}\n{restart}")
    instance.systemctl("start", unit)
    instance.wait_for_unit(unit, ActiveState="active")
    time.sleep(0.5)  # contextd has indexed the unit's EnvironmentFile=
    instance.write(env, "MODE=bad\n")
    wait_until("contextd recorded the edit", lambda: any(
        e.get("path") == env for e in call(instance, "ListEvents", interface=CONTEXT,
                                           kind="config")["events"]), 10)
    return env


def test_restart_on_failure_restarts_into_a_bad_config(sentry: Instance) -> None:
    unit = "cmp-conf.service"
    config_edited(sentry, unit, RESTART)
    sentry.systemctl("restart", unit, check=False)
    compare("a config file edited by hand", sentry, unit)


def test_a_stale_state_file_is_named_restarted_once_then_left(sentry: Instance) -> None:
    """A stale lock in the unit's StateDirectory= that the journal names:
    no allowlisted tool removes state (it may be the only copy of
    something), so one restart, then a human, the state untouched."""
    unit = "pl-state.service"
    state = "/var/lib/pl-state"
    program(sentry, "/usr/local/bin/pl-state",
            f'if [ -e {state}/lock ]; then echo "pl-state: stale lock {state}/lock" >&2; '
            "exit 1; fi\nexec sleep infinity\n")
    install(sentry, unit, "ExecStart=/usr/local/bin/pl-state\nStateDirectory=pl-state\n")
    sentry.systemctl("start", unit)
    sentry.wait_for_unit(unit, ActiveState="active")
    sentry.write(f"{state}/lock", "4242\n")
    before = snapshot(sentry)
    sentry.systemctl("restart", unit, check=False)
    [incident] = incidents(sentry, unit, 1)
    assert (incident["cause"]["kind"], incident["cause"]["subject"]) == ("stale_state", state)
    assert incident["cause"]["fixable"] is False
    assert [tool for tool, _ in plan_of(incident)] == ["unit_restart"]
    assert incident["result"] == "needs_human", incident
    time.sleep(2)
    assert audited(sentry, unit) == ["unit_restart"]
    assert sentry.host_path(f"{state}/lock").read_text() == "4242\n"
    assert changed(before, snapshot(sentry)) == set()
    record("a stale lock in its state directory", incident)


def test_a_unit_file_edited_into_a_failing_start_is_named_not_undone(sentry: Instance) -> None:
    """The unit file itself was edited (and reloaded) to a command line
    that fails: no tool undoes an admin's unit file, one restart, a human."""
    unit = "pl-unitfile.service"
    install(sentry, unit, "ExecStart=/bin/sleep infinity\n")
    sentry.systemctl("start", unit)
    sentry.wait_for_unit(unit, ActiveState="active")
    time.sleep(11)  # it ran well with the first definition
    path = f"/etc/systemd/system/{unit}"
    sentry.write(path, "[Unit]\nDescription=sentry plan scenario\n[Service]\nType=exec\n"
                       "ExecStart=/bin/sleep not-a-number\n")
    wait_until("contextd recorded the edit", lambda: any(
        e.get("path") == path for e in call(sentry, "ListEvents", interface=CONTEXT,
                                            kind="unit_file")["events"]), 10)
    sentry.systemctl("daemon-reload")
    before = snapshot(sentry)
    sentry.systemctl("restart", unit, check=False)
    [incident] = incidents(sentry, unit, 1)
    assert (incident["cause"]["kind"], incident["cause"]["subject"]) == \
        ("unit_file_changed", path), incident
    assert [tool for tool, _ in plan_of(incident)] == ["unit_restart"]
    assert incident["result"] == "needs_human", incident
    assert audited(sentry, unit) == ["unit_restart"]
    assert changed(before, snapshot(sentry)) == set()
    record("the unit file edited into a failing start", incident)


def test_a_missing_program_is_left_to_a_human_untouched(sentry: Instance) -> None:
    unit = "pl-exec.service"
    install(sentry, unit, "ExecStart=/usr/local/bin/pl-exec-is-gone\n")
    before = snapshot(sentry)
    sentry.systemctl("start", unit, check=False)
    [incident] = incidents(sentry, unit, 1)
    assert incident["cause"]["kind"] == "executable_missing", incident
    assert incident["cause"]["subject"] == "/usr/local/bin/pl-exec-is-gone"
    assert plan_of(incident) == [] and incident["result"] == "needs_human"
    assert audited(sentry, unit) == []
    assert changed(before, snapshot(sentry)) == set()
    record("a missing program", incident)


def test_a_unit_dying_a_second_after_each_start_is_never_healed(sentry: Instance) -> None:
    """It ran well for 11 s after it was installed with a drop-in (nothing
    links either to its failures), then dies 1.05 s after every start: the
    failure of sentry's restart must not make the drop-in look guilty. The
    restart did not hold and nothing else applies: the unit is left failed
    in an open episode, not triaged again while nothing changes."""
    unit = "pl-flap.service"
    marker = "/run/pl-flap-once"
    sentry.run(["rm", "-f", marker])
    install(sentry, unit, f"ExecStart=/bin/sh -c 'test -e {marker} && {{ sleep 1.05; exit 1; }}; "
                          f"touch {marker}; sleep 11; exit 1'\n")
    dropin = f"/etc/systemd/system/{unit}.d/10-nice.conf"
    sentry.write(dropin, "[Service]\nNice=5\n")
    sentry.systemctl("daemon-reload")
    sentry.systemctl("start", unit)
    [first] = incidents(sentry, unit, 1, timeout=120)
    time.sleep(5)  # the breaker's backoff (1 s here) passes: no second incident
    found = incidents(sentry, unit, 1)
    assert len(found) == 1 and first["result"] == "failed", found
    [verify] = [p for p in first["phases"] if p["name"] == "verify"]
    assert verify["outcome"] == "ok" and "not active through" in verify["detail"]
    assert audited(sentry, unit) == ["unit_restart"] and sentry.host_path(dropin).exists()
    episodes = call(sentry, "GetStatus")["episodes"]
    assert [(e["unit"], e["triages"]) for e in episodes if e["unit"] == unit] == [(unit, 1)]
    record("dies 1.05 s after each start", first)
    sentry.systemctl("stop", unit, check=False)


def test_restart_on_failure_retries_a_missing_program(sentry: Instance) -> None:
    unit = "cmp-exec.service"
    install(sentry, unit, f"ExecStart=/usr/local/bin/cmp-exec-is-gone\n{RESTART}")
    sentry.systemctl("start", unit, check=False)
    compare("a missing program", sentry, unit)


def test_restart_on_failure_cannot_tell_a_flapping_unit(sentry: Instance) -> None:
    unit = "cmp-flap.service"
    install(sentry, unit, f"ExecStart=/bin/sh -c 'sleep 1.05; exit 1'\n{RESTART}")
    sentry.systemctl("start", unit)
    compare("dies 1.05 s after each start", sentry, unit)


# --- left alone -------------------------------------------------------------------

def test_a_benign_dropin_is_reported_not_reverted(sentry: Instance) -> None:
    """The drop-in was loaded and the unit ran with it for 11 s before it
    crashed: nothing links the drop-in to the crash."""
    unit = "pl-benign.service"
    marker = "/run/pl-benign-once"
    sentry.run(["rm", "-f", marker])
    install(sentry, unit, f"ExecStart=/bin/sh -c 'test -e {marker} && exec sleep infinity; "
                          f"touch {marker}; sleep 11; exit 1'\n")
    dropin = f"/etc/systemd/system/{unit}.d/10-log.conf"
    sentry.write(dropin, "[Service]\nEnvironment=LOG=verbose\n")
    sentry.systemctl("daemon-reload")
    before = snapshot(sentry)
    sentry.systemctl("start", unit)
    [incident] = incidents(sentry, unit, 1, timeout=60)
    assert incident["cause"]["kind"] == "transient", incident
    assert any(dropin in line and "not linked" in line for line in incident["findings"])
    assert plan_of(incident) == [("unit_restart", "succeeded")]
    assert incident["result"] == "healed"
    assert sentry.host_path(dropin).exists()
    assert changed(before, snapshot(sentry)) == set()
    record("a crash 11 s after start, a benign drop-in", incident)
    sentry.systemctl("stop", unit)


def test_a_protected_unit_is_never_touched(sentry: Instance) -> None:
    unit = "pl-prot-db.service"
    install(sentry, unit, "ExecStart=/bin/sh -c 'sleep 0.2; exit 1'\n")
    before = snapshot(sentry)
    sentry.systemctl("start", unit)
    [incident] = incidents(sentry, unit, 1)
    assert incident["result"] == "protected" and incident["summary"].endswith(
        "protected: no action")
    assert json.loads(json.dumps(incident.get("plan") or [])) == []
    time.sleep(2)
    assert audited(sentry, unit) == []
    assert sentry.show(unit, "ActiveState")["ActiveState"] == "failed"
    assert changed(before, snapshot(sentry)) == set()
    RESULTS.append(("a protected unit", "sentry", "no (protected)", "-", "nothing"))
