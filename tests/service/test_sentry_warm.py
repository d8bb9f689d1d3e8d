"""sentry thinks with a warm session, over real sockets: SmolLM2 in a real
modeld and runtimed, toold, inferenced and contextd as in
test_sentry_model.py. At start, before any incident, sentry opens a runtimed
session for the triage model with the prompt's stable part resident; two
incidents in a row each prefill only their own turn after that prefix, in
the same session; when runtimed is restarted (the session gone with it),
sentry opens a new one by itself and the next incident is decided in it."""

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import varlink

from tests.models import SMOLLM2_SHA256, register, require_llama, smollm2
from tests.service.contextd_node import contextd, on, wait_event
from tests.support import Activated, activated

require_llama()

UNIT = "demo-web.service"
SENTRY = "io.syntrop.Sentry1"
RUNTIME = "io.syntrop.Runtime1"
#: How long sentry may take to open its session (a deadline for polling,
#: never a pass/fail timing: a loaded CI host loads the model slowly).
PATIENCE = 60.0


def call(daemon: Activated, interface: str, method: str, **params: Any) -> Any:
    with varlink.Client(address=daemon.address) as client, client.open(interface) as proxy:
        return getattr(proxy, method)(**params)


def sessions(runtime: Activated) -> int:
    """Sessions on SmolLM2's triage lane, where sentry opens its own."""
    load = call(runtime, RUNTIME, "GetLoad")
    return sum(m["sessions"] for m in load["models"] if m["name"] == "smollm2 (triage)")


def wait_for_session(runtime: Activated) -> None:
    deadline = time.monotonic() + PATIENCE
    while sessions(runtime) < 1:
        assert time.monotonic() < deadline, "sentry opened no session"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """modeld (SmolLM2 stored), toold, inferenced and contextd on one root
    (runtimed is each test's); a drop-in of UNIT created and recorded."""
    base = tmp_path_factory.mktemp("sentry-warm")
    units = base / "units"
    (units / f"{UNIT}.d").mkdir(parents=True)
    (units / UNIT).write_text("[Service]\nExecStart=/usr/bin/demo-web\n")
    root = base / "root"
    (root / "config").mkdir(parents=True)
    with ExitStack() as stack:
        running = stack.enter_context(contextd(root, [units]))
        dropin = units / f"{UNIT}.d" / "50-bad.conf"
        dropin.write_text("[Service]\nExecStart=\nExecStart=/bin/false\n")
        wait_event(running, on(dropin, "created"))
        started = [stack.enter_context(activated("modeld", root)),
                   stack.enter_context(activated("toold", root)),
                   stack.enter_context(activated("inferenced", root))]
        register(root, "smollm2", smollm2(), SMOLLM2_SHA256)
        for daemon in started:  # exec'd now, not during the test
            with varlink.Client(address=daemon.address) as client:
                client.get_interfaces()
        yield root


def sentry(root: Path, log: int) -> Any:
    (root / "config" / "sentry.toml").write_text(
        # SmolLM2 is never chosen unless named (phases.choose_model): named
        # here, as the small model these tests can afford.
        'model = "smollm2"\n'
        "[budgets]\ndecide = 60000\ndecide_ready = 120000\n[breaker]\ncap = 100\n"
        "base_sec = 0\n")
    return activated("systemd-sentry", root, stderr=log,
                     extra_env={"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={root}/no-bus"})


def decide(daemon: Activated) -> dict[str, Any]:
    call(daemon, SENTRY, "ResetBreaker", unit=UNIT)
    incident = call(daemon, SENTRY, "Triage", unit=UNIT)["incident"]
    [found] = [p for p in incident["phases"] if p["name"] == "decide"]
    assert found["outcome"] == "ok", found["detail"]
    assert incident["decided_by"] == "model", incident
    # One of the offered plans (which one is the model's business here).
    assert incident.get("decision") in (None, json.dumps(
        {"parameters": {"unit": UNIT}, "tool": "unit_restart"}, sort_keys=True)), incident
    detail: str = found["detail"]
    return {"detail": detail, "ms": found["duration_usec"] / 1000}


def kept(detail: str) -> int:
    """The prefix tokens the session kept for this incident (PrefillSuffix)."""
    return int(detail.split(" prefix tokens kept")[0].rsplit("(", 1)[1])


def reused(detail: str) -> tuple[int, int]:
    """EnsurePrefix's reused and prefilled tokens before the incident's turn."""
    words = detail.split(" prefix tokens reused, ")
    return int(words[0].rsplit(" ", 1)[1]), int(words[1].split(" ", 1)[0])


def test_sentry_decides_in_a_warm_session_reopened_after_a_restart(root: Path) -> None:
    first = ExitStack()
    runtime = first.enter_context(activated("runtimed", root))
    log = root / "sentry.log"
    try:
        with log.open("ab") as out, sentry(root, out.fileno()) as daemon:
            # Opened at start (socket activation: the first call starts
            # sentry), before any incident.
            assert call(daemon, SENTRY, "GetStatus")["open_incidents"] == 0
            wait_for_session(runtime)
            one, two = decide(daemon), decide(daemon)
            # Both in the one session: the prefix kept, only the turn prefilled.
            assert kept(one["detail"]) > 0 and kept(two["detail"]) == kept(one["detail"]), (
                one, two)
            assert "reopened" not in one["detail"] + two["detail"]
            # The prefix was resident before each: all of it reused, none prefilled.
            assert reused(one["detail"]) == reused(two["detail"]) == (kept(one["detail"]), 0)
            assert sessions(runtime) == 1
            first.close()  # runtimed goes, and its session with it
            with activated("runtimed", root) as again:
                wait_for_session(again)  # sentry saw it and opened a new one
                three = decide(daemon)
                assert kept(three["detail"]) == kept(one["detail"]), three
                assert reused(three["detail"]) == (kept(one["detail"]), 0), three
                assert sessions(again) == 1
            print(f"\nwarm decides {one['ms']:.0f} ms, {two['ms']:.0f} ms; after a "
                  f"restart {three['ms']:.0f} ms: {two['detail']}")
    except BaseException:
        print(log.read_text(errors="replace")[-4000:])  # sentry's side of it
        raise
    finally:
        first.close()
