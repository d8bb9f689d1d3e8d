"""The model's plan over real sockets: the triage model (Qwen2.5-Coder-0.5B,
from its packages) stored in a real modeld beside SmolLM2 and run by a real
runtimed; toold lists its tools;
contextd has seen a drop-in appear; inferenced grants the EmergencyTriage
lease; sentry asks Runtime1.Chat and the incident says decided_by=model
with the answer, the offered plans and the timings. With a decide budget
too small for the model the phase times out and the rules' plan stands,
and the incident says that instead. No systemd here, so nothing links the
drop-in to the failure (systemd would say when the unit last ran and
started): it is reported, not reverted, and the plan is a restart; the
action itself fails, which is not the point."""

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import varlink

from syntrop.packaged import QWEN_CODER_05B
from tests.models import model_node, register, require_llama, triage_model
from tests.service.contextd_node import contextd, on, wait_event
from tests.support import Activated, activated

require_llama()

UNIT = "demo-web.service"
SENTRY = "io.syntrop.Sentry1"


def call(daemon: Activated, method: str, **params: Any) -> Any:
    with varlink.Client(address=daemon.address) as client, client.open(SENTRY) as proxy:
        return getattr(proxy, method)(**params)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """modeld + runtimed (SmolLM2), toold, inferenced and contextd on one
    root; a drop-in of UNIT created and recorded."""
    base = tmp_path_factory.mktemp("sentry-model")
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
        started = [stack.enter_context(model_node(root, stack)),
                   stack.enter_context(activated("toold", root)),
                   stack.enter_context(activated("inferenced", root))]
        # sentry asks it whenever modeld has it, before any pinned model.
        register(root, QWEN_CODER_05B.name, triage_model(), QWEN_CODER_05B.sha256)
        for daemon in started:  # exec'd now, not during the first test
            with varlink.Client(address=daemon.address) as client:
                client.get_interfaces()
        yield root


def sentry(root: Path, decide_ms: int) -> Any:
    (root / "config" / "sentry.toml").write_text(
        f"[budgets]\ndecide = {decide_ms}\ndecide_ready = 120000\n[breaker]\ncap = 100\n"
        "base_sec = 0\n")
    return activated("systemd-sentry", root,
                     extra_env={"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={root}/no-bus"})


def phase(incident: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any]
    [found] = [p for p in incident["phases"] if p["name"] == name]
    return found


def test_the_model_decides_with_the_evidence(root: Path) -> None:
    # A generous budget: the first call loads the model into runtimed.
    with sentry(root, 60_000) as daemon:
        call(daemon, "ResetBreaker", unit=UNIT)
        incident = call(daemon, "Triage", unit=UNIT)["incident"]
        decide = phase(incident, "decide")
        assert phase(incident, "lease")["outcome"] == "ok", incident
        assert decide["outcome"] == "ok", decide["detail"]
        assert incident["decided_by"] == "model", incident
        # Which of the two it takes is its judgment (no exit status and no
        # journal here: restart and nothing are both defensible).
        decision = json.loads(incident["decision"]) if incident.get("decision") else None
        assert decision in (None, {"tool": "unit_restart", "parameters": {"unit": UNIT}}), \
            decision
        assert incident["cause"]["kind"] == "transient"
        assert any("50-bad.conf" in line and "not linked" in line
                   for line in incident["findings"]), incident["findings"]
        # The incident carries the raw answer, what was offered and the timings.
        assert "answer '\"restart\"'" in decide["detail"] or \
            "answer '\"nothing\"'" in decide["detail"], decide
        assert "offered unit_restart | nothing" in decide["detail"], decide
        assert " tokens; session (" in decide["detail"], decide  # the warm session's
        # Warm, a second decision of the same failure (its breaker reset, or
        # the second failure would be a crash loop left to a human): the
        # same plan (greedy, seeded), timed.
        call(daemon, "ResetBreaker", unit=UNIT)
        again = call(daemon, "Triage", unit=UNIT)["incident"]
        assert again["decided_by"] == "model", again
        assert again.get("decision") == incident.get("decision"), (again, incident)
        print(f"\ncold decide {decide['duration_usec'] / 1000:.0f} ms, warm decide "
              f"{phase(again, 'decide')['duration_usec'] / 1000:.0f} ms: "
              f"{phase(again, 'decide')['detail']}")


def test_a_decide_overrun_falls_back_to_the_rules(root: Path) -> None:
    with sentry(root, 1) as daemon:
        call(daemon, "ResetBreaker", unit=UNIT)
        incident = call(daemon, "Triage", unit=UNIT)["incident"]
        decide = phase(incident, "decide")
        assert decide["outcome"] == "timeout", decide
        assert decide["detail"].startswith("over its budget of 1 ms; the model "), decide
        assert incident["decided_by"] == "rules"
        # The rules saw the same drop-in, could not link it, and restart.
        assert json.loads(incident["decision"]) == {
            "tool": "unit_restart", "parameters": {"unit": UNIT}}
        assert phase(incident, "release")["outcome"] == "ok"
