"""Who may do what, on a real systemd with a real polkitd: every privileged
method called as an unprivileged user (nobody), as an operator (a member of
the `syntrop` group, which the shipped polkit rule grants the operator
actions) and, where it matters, as root.

Each refusal must be the interface's declared NotAuthorized naming the
polkit action, and must change nothing: dbus.service is not frozen by a
lease nobody took on it, no breaker is reset, no model is registered."""

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.system.instance import NOBODY, Instance, call_as
from tests.unit.modeld.ggufs import write_tiny

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
    ("Model1", "OpenModel", {"name": "nosuch"}, "io.syntrop.model.read"),
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


def lease_in_scope(instance: Instance, scope: str, unit: str) -> dict[str, Any]:
    """AcquireLease(unit=...) as nobody, from a process in its own scope
    under nobody's user slice (user.slice/user-65534.slice/SCOPE), as a
    login session's process would be."""
    import json

    from tests.system.instance import RAW_CALL
    out = instance.run([
        "systemd-run", "--quiet", "--scope", f"--unit={scope}", "--slice=user-65534.slice",
        "setpriv", *NOBODY, "/usr/bin/python3", "-c", RAW_CALL, "io.syntrop.Inference1",
        "AcquireLease", json.dumps({**LEASE, "priority": "Batch", "unit": unit})],
        timeout=60).stdout
    return dict(json.loads(out))


@pytest.mark.parametrize("unit", ["user.slice", "system.slice", "user-65534.slice"])
def test_nobody_cannot_lease_a_slice_it_runs_in(authz: Instance, unit: str) -> None:
    """A slice above the caller holds every other session of the host (and
    root's): leasing it would let nobody freeze them all."""
    reply = lease_in_scope(authz, f"reach-{unit.removesuffix('.slice')}.scope", unit)
    assert refused(reply, "Inference1", "io.syntrop.inference.lease-others"), reply
    leases = authz.call("io.syntrop.Inference1", "ListLeases")["leases"]
    assert not [x for x in leases if x.get("client_unit") == unit], leases
    for slice_ in ("user.slice", "system.slice", "user-65534.slice"):
        assert authz.show(slice_, "FreezerState")["FreezerState"] == "running", slice_


def test_a_lease_on_a_unit_with_no_cgroup_is_invalid(authz: Instance) -> None:
    reply = lease_in_scope(authz, "reach-nosuch.scope", "nosuch-at-all.service")
    assert reply.get("error") == "io.syntrop.Inference1.InvalidParameter", reply
    assert reply.get("parameters") == {"parameter": "unit"}, reply


def test_nobody_leases_its_own_scope(authz: Instance) -> None:
    """The scope it runs in, holding only its own processes, is its own."""
    reply = lease_in_scope(authz, "own-lease.scope", "own-lease.scope")
    assert "error" not in reply, reply
    lease = reply["parameters"]["lease_id"]
    listed = [x["id"] for x in authz.call("io.syntrop.Inference1", "ListLeases")["leases"]]
    if lease in listed:  # its process has exited: inferenced may have let it go
        authz.call("io.syntrop.Inference1", "ReleaseLease", lease_id=lease)


def test_someone_elses_lease_cannot_be_frozen_or_released(authz: Instance) -> None:
    lease = authz.call("io.syntrop.Inference1", "AcquireLease", **LEASE, priority="Batch",
                       unit="dbus.service", pid=None)["lease_id"]
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
    """polkit's rule for the syntrop group: the operator actions pass (the
    method then answers as it would for root); leasing for others,
    emergency leases and remediation tools stay an administrator's.

    modeld, runtimed and routerd run as static users of their own, which
    reach the system bus, so they can ask polkit (a DynamicUser process
    cannot: docs/SECURITY.md)."""
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


def test_an_operator_manages_models_the_runtime_and_the_router(
        authz: Instance, tmp_path: Path) -> None:
    """Register, Pin, OpenModel, Unpin, Remove; Unload; Reload and
    TestProvider: each answers the operator as it answers root."""
    model = "/srv/syntrop-operator.gguf"
    write_tiny(tmp_path / "op.gguf", seed=11)
    authz.run(["mkdir", "-p", "/srv"])
    shutil.copyfile(tmp_path / "op.gguf", authz.host_path(model))
    authz.run(["chmod", "0644", model])
    steps: list[tuple[str, str, dict[str, Any]]] = [
        ("Model1", "Register", {"name": "op-tiny", "path": model}),
        ("Model1", "Pin", {"name": "op-tiny"}),
        ("Model1", "OpenModel", {"name": "op-tiny"}),
        ("Model1", "Unpin", {"name": "op-tiny"}),
        ("Model1", "Prune", {"budget_bytes": 0, "dry_run": True}),
        ("Model1", "Remove", {"name": "op-tiny"}),
        ("Runtime1", "Unload", {}),
        ("Router1", "Reload", {}),
    ]
    for interface, method, parameters in steps:
        reply = as_user(authz, OPERATOR, f"io.syntrop.{interface}", method, **parameters)
        assert "error" not in reply, (method, reply, authz.journal("modeld.service", 20),
                                      authz.journal("polkit.service", 20))
    models = authz.call("io.syntrop.Model1", "List")["models"]
    assert "op-tiny" not in [m["name"] for m in models], models
    # The same file, from nobody: refused, and nothing stored.
    reply = as_user(authz, "nobody", "io.syntrop.Model1", "Register", name="op-tiny",
                    path=model)
    assert refused(reply, "Model1", "io.syntrop.model.manage"), reply


def test_a_daemon_account_gets_only_what_its_allow_lists_name(authz: Instance) -> None:
    """modeld, runtimed and routerd each run as an account of their own, in
    the syntrop group: routerd's reaches runtimed's fleet hand-off (Prefill)
    and runtimed's modeld's OpenModel, and nothing else; the operator rule
    leaves the daemon accounts out."""
    def may(user: str, interface: str, method: str, action: str,
            **parameters: Any) -> bool:
        reply = as_user(authz, user, f"io.syntrop.{interface}", method, **parameters)
        if refused(reply, interface, action):
            return False
        assert "NotAuthorized" not in str(reply.get("error")), reply
        return True

    prefill = {"model": "nosuch", "messages": [{"role": "user", "content": "hi"}]}
    assert may("syntrop-router", "Runtime1", "Prefill", "io.syntrop.runtime.manage", **prefill)
    assert not may("syntrop-router", "Runtime1", "Unload", "io.syntrop.runtime.manage")
    assert not may("syntrop-router", "Model1", "OpenModel", "io.syntrop.model.read",
                   name="nosuch")
    assert not may("syntrop-router", "Model1", "Remove", "io.syntrop.model.manage",
                   name="nosuch")
    assert may("syntrop-runtime", "Model1", "OpenModel", "io.syntrop.model.read",
               name="nosuch")
    assert not may("syntrop-runtime", "Model1", "Remove", "io.syntrop.model.manage",
                   name="nosuch")
    assert not may("syntrop-runtime", "Runtime1", "Unload", "io.syntrop.runtime.manage")
    assert not may("syntrop-model", "Runtime1", "Prefill", "io.syntrop.runtime.manage",
                   **prefill)
    assert not may("syntrop-model", "Router1", "Reload", "io.syntrop.router.manage")
