"""systemd-sentry over its real activated socket, with no systemd and no
other daemon: it still serves Sentry1 (subscribed=false, degraded), refuses
bad input with declared errors, and a manual Triage runs every phase, each
failing fast, so the rules decide and the incident records it."""

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Activated, activated, declared_error, varlink_call

NAME = "io.syntrop.Sentry1"


@pytest.fixture(scope="module")
def sentry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Activated]:
    root = tmp_path_factory.mktemp("sentry")
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "sentry.toml").write_text(
        "ignore = [\"left-alone.service\"]\n[breaker]\ncap = 2\nbase_sec = 60\n")
    env = {"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={root}/no-bus"}
    with activated("systemd-sentry", root, extra_env=env) as daemon:
        call(daemon, "GetStatus")  # systemd-socket-activate execs sentry now
        yield daemon
        assert daemon.process.poll() is None, "sentry died"


def call(daemon: Activated, method: str, **params: Any) -> Any:
    return varlink_call(daemon.address, NAME, method, **params)


def error(daemon: Activated, method: str, **params: Any) -> tuple[str, dict[str, Any]]:
    return declared_error(call, daemon, method, **params)


def test_sentry_serves_without_systemd(sentry: Activated) -> None:
    status = call(sentry, "GetStatus")
    assert status["subscribed"] is False
    assert status["state"] == "degraded"


@pytest.mark.parametrize("unit", ["", "no-suffix", "bad/slash.service", "x" * 300 + ".service",
                                  "a b.service"])
def test_sentry_triage_invalid_unit_name(sentry: Activated, unit: str) -> None:
    name, _ = error(sentry, "Triage", unit=unit)
    assert name == f"{NAME}.InvalidUnitName"


def test_sentry_triage_ignored_unit(sentry: Activated) -> None:
    assert error(sentry, "Triage", unit="left-alone.service")[0] == f"{NAME}.UnitIgnored"
    assert error(sentry, "Triage", unit="toold.service")[0] == f"{NAME}.UnitIgnored"


def test_sentry_get_unknown_incident(sentry: Activated) -> None:
    name, params = error(sentry, "GetIncident", id="nope")
    assert (name, params) == (f"{NAME}.IncidentNotFound", {"id": "nope"})


def test_sentry_list_bad_limit(sentry: Activated) -> None:
    name, params = error(sentry, "ListIncidents", limit=-1)
    assert name == "org.varlink.service.InvalidParameter"
    assert params == {"parameter": "limit"}


def test_sentry_manual_triage_phases_fail_fast_rules_decide(sentry: Activated) -> None:
    started = time.monotonic()
    incident = call(sentry, "Triage", unit="demo.service")["incident"]
    elapsed = time.monotonic() - started
    assert elapsed < 5
    phases = {p["name"]: p["outcome"] for p in incident["phases"]}
    assert phases == {"context": "failed", "gang": "skipped", "lease": "failed",
                      "decide": "skipped",
                      "execute": "failed", "verify": "skipped", "release": "skipped"}
    assert incident["decided_by"] == "rules"
    assert json.loads(incident["decision"]) == {
        "tool": "unit_restart", "parameters": {"unit": "demo.service"}}
    assert incident["result"] == "failed"
    assert incident["trigger"] == "manual"

    listed = call(sentry, "ListIncidents", unit="demo.service")["incidents"]
    assert [i["id"] for i in listed] == [incident["id"]]
    assert call(sentry, "GetIncident", id=incident["id"])["incident"] == incident

    # one attempt made: the breaker is open for its backoff, and says so
    name, params = error(sentry, "Triage", unit="demo.service")
    assert name == f"{NAME}.BreakerOpen" and params["open_until_usec"] > 0
    breakers = call(sentry, "GetStatus")["breakers"]
    assert [(b["unit"], b["state"], b["attempts"]) for b in breakers] == [
        ("demo.service", "open", 1)]

    call(sentry, "ResetBreaker", unit="demo.service")
    assert call(sentry, "GetStatus")["breakers"] == []
    second = call(sentry, "Triage", unit="demo.service")["incident"]
    assert second["id"] != incident["id"]
    assert call(sentry, "GetStatus")["incidents_total"] >= 2


def test_sentry_incidents_survive_restart(tmp_path: Path) -> None:
    env = {"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus"}
    with activated("systemd-sentry", tmp_path, extra_env=env) as daemon:
        incident = call(daemon, "Triage", unit="kept.service")["incident"]
    with activated("systemd-sentry", tmp_path, extra_env=env) as daemon:
        assert call(daemon, "GetIncident", id=incident["id"])["incident"] == incident
        assert error(daemon, "ResetBreaker", unit="bad name")[0] == f"{NAME}.InvalidUnitName"


def syn(daemon: Activated, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUNTIME_DIRECTORY": str(daemon.root / "run"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "syntrop.cli.syn", "incidents", *args],
                          env=env, capture_output=True, text=True, timeout=60, check=False)


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def test_syn_incidents_table_one_in_full_and_json(tmp_path: Path) -> None:
    env = {"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus"}
    with activated("systemd-sentry", tmp_path, extra_env=env) as daemon:
        first = call(daemon, "Triage", unit="shown.service")["incident"]
        call(daemon, "Triage", unit="other.service")

        table = syn(daemon, "--limit", "5")
        assert table.returncode == 0, table.stderr
        assert "2 incidents" in table.stdout
        row = next(line for line in table.stdout.splitlines() if "shown.service" in line)
        assert first["id"][:12] in row and "unit_restart" in row and "rules" in row
        assert "failed" in row

        full = syn(daemon, first["id"])
        assert full.returncode == 0, full.stderr
        for name in ("context", "gang", "lease", "decide", "execute", "verify", "release"):
            assert name in full.stdout
        assert "result: failed" in full.stdout and "(by rules)" in full.stdout

        assert "cause: transient: no change explains it" in full.stdout
        assert "1. unit_restart:" in full.stdout
        as_json = syn(daemon, "--json", "--unit", "shown.service")
        # python-varlink leaves out null fields; syn --json writes them.
        assert [without_nulls(i) for i in json.loads(as_json.stdout)] == [first]
        assert without_nulls(json.loads(syn(daemon, first["id"], "--json").stdout)) == first

        short = syn(daemon, first["id"][:12])  # as the table shows it
        assert short.returncode == 0 and f"incident {first['id']}" in short.stdout, short.stderr
        missing = syn(daemon, "nope")
        assert missing.returncode == 1 and "Traceback" not in missing.stderr
        assert missing.stderr.strip() == \
            "syn: no incident id starts with 'nope' (syn incidents lists them)"
        missing = syn(daemon, "f" * 32)
        assert missing.stderr.strip() == \
            f'syn: systemd-sentry answered IncidentNotFound {{"id": "{"f" * 32}"}}'
        bad = syn(daemon, "--unit", "no/such")
        assert bad.returncode == 1 and bad.stderr.startswith("syn: systemd-sentry answered "
                                                             "InvalidParameter")
        assert syn(daemon, "--limit", "5000").stderr.strip() == \
            "syn: --limit must be between 0 and 1000"
    gone = syn(daemon)
    assert gone.returncode == 1 and gone.stderr.startswith("syn: cannot reach systemd-sentry")
