"""Who may do what, on a real systemd with a real polkitd: every privileged
method called as an unprivileged user (nobody), as an operator (a member of
the `syntrop` group, which the shipped polkit rule grants the operator
actions) and, where it matters, as root.

Each refusal must be the interface's declared NotAuthorized naming the
polkit action, and must change nothing: dbus.service is not frozen by a
lease nobody took on it, no breaker is reset, no model is registered."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.system.instance import NOBODY, Instance, call_as

OPERATOR = "syntrop-op"


@pytest.fixture(scope="module")
def authz(instance: Instance) -> Iterator[Instance]:
    instance.run(["sh", "-c", f"getent passwd {OPERATOR} >/dev/null || "
                              f"useradd --system --no-create-home -G syntrop {OPERATOR}"])
    yield instance
    # The calls socket-activated sentry: left running, it would triage the
    # failures later tests cause on purpose.
    instance.systemctl("stop", "systemd-sentry.service", check=False)


def as_user(instance: Instance, user: str, interface: str, method: str,
            **parameters: Any) -> dict[str, Any]:
    more = method in STREAMING
    if user == "nobody":
        ids: tuple[str, ...] = NOBODY
    else:
        uid, gid = instance.run(["sh", "-c", f"id -u {user}; id -g {user}"]).stdout.split()
        ids = (f"--reuid={uid}", f"--regid={gid}", "--init-groups")
    return call_as(instance, ids, interface, method, more=more, **parameters)


def refused(reply: dict[str, Any], interface: str, action: str) -> bool:
    return reply.get("error") == f"io.syntrop.{interface}.NotAuthorized" and \
        reply.get("parameters") == {"action": action}


#: Methods that answer with "more" only.
STREAMING = {"Pull"}
LEASE: dict[str, Any] = {"memory_bytes": 1 << 20, "plane": "cpu"}

# (interface, method, parameters, the action it needs)
NOBODY_REFUSED = [
    ("Inference1", "AcquireLease", {**LEASE, "priority": "Batch", "unit": "dbus.service"},
     "io.syntrop.inference.lease-others"),
    ("Inference1", "AcquireLease", {**LEASE, "priority": "Batch", "pid": 1},
     "io.syntrop.inference.lease-others"),
    ("Inference1", "AcquireLease", {**LEASE, "priority": "EmergencyTriage"},
     "io.syntrop.inference.emergency"),
    ("Inference1", "RegisterModel", {"id": "passwd", "format": "gguf", "path": "/etc/passwd",
                                     "estimated_bytes": 4096}, "io.syntrop.model.manage"),
    ("Inference1", "Quarantine", {"plane": "cpu", "reason": "test"},
     "io.syntrop.inference.manage"),
    ("Sentry1", "Triage", {"unit": "cron.service"}, "io.syntrop.sentry.triage"),
    ("Sentry1", "ResetBreaker", {"unit": "cron.service"}, "io.syntrop.sentry.triage"),
    ("Router1", "Reload", {}, "io.syntrop.router.manage"),
    ("Router1", "TestProvider", {"provider": "runtimed-local"}, "io.syntrop.router.manage"),
    ("Runtime1", "Unload", {}, "io.syntrop.runtime.manage"),
    ("Model1", "Remove", {"name": "nosuch"}, "io.syntrop.model.manage"),
    ("Model1", "Prune", {"budget_bytes": 0}, "io.syntrop.model.manage"),
    ("Tool1", "Execute", {"tool": "unit_restart", "parameters": {"unit": "cron.service"}},
     "io.syntrop.tool.execute"),
    ("Tool1", "ExecutePlan", {"unit": "cron.service", "steps": [
        {"tool": "unit_restart", "parameters": {"unit": "cron.service"}}]},
     "io.syntrop.tool.execute"),
    ("Tool1", "GetAudit", {}, "io.syntrop.tool.execute"),
    ("Inference1", "Unquarantine", {"plane": "cpu"}, "io.syntrop.inference.manage"),
    ("Inference1", "AcquireCompositeLease", {
        "gang_id": "g", "gang_policy": "all-or-nothing", "priority": "EmergencyTriage",
        "client_unit": None, "slices": [{"plane_id": "cpu", "role": "tensor",
                                         "stage_index": None, "memory_bytes": 1 << 20}]},
     "io.syntrop.inference.emergency"),
    ("Inference1", "AcquireCompositeLease", {
        "gang_id": "g", "gang_policy": "all-or-nothing", "priority": "Batch",
        "client_unit": "dbus.service", "slices": [{"plane_id": "cpu", "role": "tensor",
                                                   "stage_index": None,
                                                   "memory_bytes": 1 << 20}]},
     "io.syntrop.inference.lease-others"),
    ("Model1", "Register", {"name": "passwd", "path": "/etc/passwd"},
     "io.syntrop.model.manage"),
    ("Model1", "Pull", {"reference": "/etc/passwd", "name": "passwd"},
     "io.syntrop.model.manage"),
    ("Model1", "Pin", {"name": "nosuch"}, "io.syntrop.model.manage"),
    ("Model1", "Unpin", {"name": "nosuch"}, "io.syntrop.model.manage"),
]


@pytest.mark.parametrize(("interface", "method", "parameters", "action"), NOBODY_REFUSED,
                         ids=[f"{i}.{m}-{n}" for n, (i, m, _, _) in enumerate(NOBODY_REFUSED)])
def test_nobody_is_refused_every_privileged_method(
        authz: Instance, interface: str, method: str, parameters: dict[str, Any],
        action: str) -> None:
    reply = as_user(authz, "nobody", f"io.syntrop.{interface}", method, **parameters)
    assert refused(reply, interface, action), reply


def test_a_lease_nobody_takes_on_dbus_never_freezes_it(authz: Instance) -> None:
    as_user(authz, "nobody", "io.syntrop.Inference1", "AcquireLease",
            **LEASE, priority="Batch", unit="dbus.service")
    leases = authz.call("io.syntrop.Inference1", "ListLeases")["leases"]
    assert not [lease for lease in leases if lease.get("client_unit") == "dbus.service"], leases
    assert authz.show("dbus.service", "FreezerState")["FreezerState"] == "running"
    models = authz.call("io.syntrop.Inference1", "ListModels")["models"]
    assert "passwd" not in [m["id"] for m in models]


def test_nobody_may_lease_for_itself(authz: Instance) -> None:
    """No pid, no unit: the lease is the caller's own, and so is releasing it."""
    reply = as_user(authz, "nobody", "io.syntrop.Inference1", "AcquireLease",
                    **LEASE, priority="Batch")
    assert "error" not in reply, reply
    lease = reply["parameters"]["lease_id"]
    # The calling process has exited: inferenced releases the lease itself,
    # or nobody's Release finds it gone; root sees it go either way.
    listed = [x["id"] for x in authz.call("io.syntrop.Inference1", "ListLeases")["leases"]]
    if lease in listed:
        authz.call("io.syntrop.Inference1", "ReleaseLease", lease_id=lease)


def test_someone_elses_lease_cannot_be_frozen_or_released(authz: Instance) -> None:
    lease = authz.call("io.syntrop.Inference1", "AcquireLease", **LEASE, priority="Batch",
                       unit="cron.service", pid=None)["lease_id"]
    try:
        for method in ("Freeze", "ReleaseLease", "Yield"):
            reply = as_user(authz, "nobody", "io.syntrop.Inference1", method, lease_id=lease)
            assert refused(reply, "Inference1", "io.syntrop.inference.lease-others"), reply
        [listed] = [x for x in authz.call("io.syntrop.Inference1", "ListLeases")["leases"]
                    if x["id"] == lease]
        assert listed["state"] == "active"
    finally:
        authz.call("io.syntrop.Inference1", "ReleaseLease", lease_id=lease)


def test_an_operator_gets_the_operator_actions_and_no_more(authz: Instance) -> None:
    """polkit's rule for the syntrop group: sentry's operator action passes
    (the method then answers as it would for root); leasing for others,
    emergency leases and remediation tools stay an administrator's.

    modeld and runtimed run as DynamicUser=: on this systemd their
    processes cannot reach the system bus at all (any DynamicUser service's
    Hello fails, "Transport endpoint is not connected"), so they cannot ask
    polkit and refuse the operator too: refused, never allowed, when polkit
    cannot be asked (docs/SECURITY.md)."""
    reset = as_user(authz, OPERATOR, "io.syntrop.Sentry1", "ResetBreaker", unit="cron.service")
    assert "error" not in reset, reset
    emergency = as_user(authz, OPERATOR, "io.syntrop.Inference1", "AcquireLease",
                        **LEASE, priority="EmergencyTriage")
    assert refused(emergency, "Inference1", "io.syntrop.inference.emergency"), emergency
    others = as_user(authz, OPERATOR, "io.syntrop.Inference1", "AcquireLease",
                     **LEASE, priority="Batch", pid=1)
    assert refused(others, "Inference1", "io.syntrop.inference.lease-others"), others
    tool = as_user(authz, OPERATOR, "io.syntrop.Tool1", "Execute", tool="unit_restart",
                   parameters={"unit": "cron.service"})
    assert refused(tool, "Tool1", "io.syntrop.tool.execute"), tool
    pin = as_user(authz, OPERATOR, "io.syntrop.Model1", "Pin", name="nosuch")
    assert refused(pin, "Model1", "io.syntrop.model.manage"), pin
    log = authz.run(["journalctl", "-u", "modeld", "--no-pager", "-o", "cat"]).stdout
    assert "polkit not asked" in log, log[-2000:]
