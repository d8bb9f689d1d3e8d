"""The seven daemons under a real systemd: socket activation through the
installed units, sandboxes as the units declare them, Type=notify and the
watchdog, idle exit and re-activation, and Varlink from independent clients
(python-varlink, varlinkctl) over the real sockets."""

import contextlib
import json
import re
import socket
import subprocess
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import varlink

from syntrop.cli.launcher import DAEMONS, Daemon
from tests.system.instance import Instance, wait_until

IDS = [daemon.program for daemon in DAEMONS]
#: Seconds a Varlink call from a test may take before it fails.
IO_TIMEOUT = 20.0
#: Services that keep root's uid (PID 1's D-Bus API; inferenced: the
#: root-owned cgroup.freeze files of other units), and the effective
#: capabilities each keeps; every other one runs as a dynamic user with none.
CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SETFCAP = 1, 3, 31
ROOT_SERVICES = {
    "inferenced": 0,
    "toold": (1 << CAP_DAC_OVERRIDE) | (1 << CAP_FOWNER) | (1 << CAP_SETFCAP),
    "systemd-sentry": 0,
}


def unit(daemon: Daemon) -> str:
    return f"{daemon.program}.service"


def address(instance: Instance, daemon: Daemon) -> str:
    return f"unix:{instance.host_path(f'/run/syntrop/{daemon.interface}')}"


@contextlib.contextmanager
def connected(instance: Instance, daemon: Daemon, interface: str) -> Iterator[typing.Any]:
    """python-varlink's proxy for `interface` over a fresh connection to the
    daemon's socket. The socket is ours, with a timeout: python-varlink's own
    are blocking without one, so a daemon that never answers (one that fails
    to start: systemd keeps the connection queued) would hang the tier. On
    failure, the unit's journal says why."""
    path = str(instance.host_path(f"/run/syntrop/{daemon.interface}"))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(IO_TIMEOUT)
    try:
        sock.connect(path)
        with (
            varlink.Client(address=f"unix:{path}") as client,
            client.open(interface, connection=sock) as proxy,
        ):
            yield proxy
    except (OSError, varlink.VarlinkError) as error:
        raise AssertionError(
            f"{daemon.program}: {error!r}; its journal:\n{instance.journal(unit(daemon), 30)}"
        ) from error
    finally:
        sock.close()


def get_info(instance: Instance, daemon: Daemon) -> dict[str, typing.Any]:
    with connected(instance, daemon, "org.varlink.service") as service:
        return dict(service.GetInfo())


def status_of(instance: Instance, pid: str) -> dict[str, str]:
    """/proc/<pid>/status of a process of the instance, read from the host."""
    text = instance.host_path(f"/proc/{pid}/status").read_text()
    return {
        key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())
    }


def varlinkctl(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        stdin=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "SYSTEMD_COLORS": "0"},
    )


# --- activation -------------------------------------------------------------


@pytest.mark.parametrize("daemon", DAEMONS, ids=IDS)
def test_first_connection_activates_the_service(instance: Instance, daemon: Daemon) -> None:
    instance.systemctl("stop", unit(daemon))
    assert instance.show(unit(daemon), "ActiveState")["ActiveState"] == "inactive"
    socket_state = instance.show(f"{daemon.program}.socket", "ActiveState", "SubState")
    assert socket_state == {"ActiveState": "active", "SubState": "listening"}

    info = get_info(instance, daemon)

    assert info["product"] == daemon.program
    assert info["vendor"] == "syntrop"
    assert daemon.interface in info["interfaces"]
    instance.wait_for_unit(unit(daemon), ActiveState="active", SubState="running")
    shown = instance.show(unit(daemon), "MainPID", "NRestarts", "Result")
    assert shown["MainPID"] != "0"
    assert shown["NRestarts"] == "0"
    assert shown["Result"] == "success"


@pytest.mark.parametrize("daemon", DAEMONS, ids=IDS)
def test_service_runs_in_the_declared_sandbox(instance: Instance, daemon: Daemon) -> None:
    """What the kernel says about the running process, not what the unit says."""
    get_info(instance, daemon)
    instance.wait_for_unit(unit(daemon), ActiveState="active")
    pid = instance.show(unit(daemon), "MainPID")["MainPID"]
    status = status_of(instance, pid)
    uid = status["Uid"].split()
    if daemon.program in ROOT_SERVICES:
        assert uid == ["0"] * 4
        assert int(status["CapEff"], 16) == ROOT_SERVICES[daemon.program]
    else:
        assert uid[0] != "0" and len(set(uid)) == 1, f"expected a dynamic user, got {uid}"
        assert int(status["CapEff"], 16) == 0
    assert int(status["CapBnd"], 16) == int(status["CapEff"], 16)
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # a filter is installed
    # MemoryDenyWriteExecute=yes: no writable and executable mapping exists.
    maps = instance.host_path(f"/proc/{pid}/maps").read_text()
    assert not [line for line in maps.splitlines() if line.split()[1].startswith("rwx")]
    # Only inferenced (cgroup.freeze of leases) and runtimed (its delegated
    # subtree: a cgroup per engine worker) see the cgroup tree writable;
    # runtimed's dynamic user owns nothing else in it.
    mounts = {
        fields[4]: fields[5].split(",")[0]
        for fields in (
            line.split()
            for line in instance.host_path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        )
    }
    expected = "rw" if daemon.program in ("inferenced", "runtimed") else "ro"
    assert mounts["/sys/fs/cgroup"] == expected
    assert mounts["/sys"] == "ro"
    assert mounts.get("/home") == "ro"  # ProtectHome=yes: an empty, read-only directory


def test_inferenced_sees_the_processes_of_other_users(instance: Instance) -> None:
    """A lease lives and dies with a process that inferenced (a dynamic user)
    looks up in /proc: here PID 1, root's. ProtectProc=invisible would hide it."""
    daemon = next(d for d in DAEMONS if d.program == "inferenced")
    with connected(instance, daemon, daemon.interface) as inference:
        lease = inference.AcquireLease(
            priority="Batch", memory_bytes=1 << 20, plane=None, unit=None, pid=1
        )
        inference.ReleaseLease(lease_id=lease["lease_id"])


def test_state_directories_belong_to_their_daemons(instance: Instance) -> None:
    for daemon in DAEMONS:
        get_info(instance, daemon)
    listing = instance.run(
        [
            "stat",
            "-L",
            "-c",
            "%n %U %a",
            *(
                f"/var/lib/syntrop/{name}"
                for name in (
                    "inferenced",
                    "models",
                    "contextd",
                    "toold",
                    "runtimed",
                    "sentry",
                    "routerd",
                )
            ),
        ]
    ).stdout.split("\n")
    owners = dict(line.split(" ", 1) for line in listing if line)
    # modeld, runtimed and routerd: a static user each (in group syntrop),
    # which can ask polkit; none may act as another.
    for name, user in (("models", "syntrop-model"), ("runtimed", "syntrop-runtime"),
                       ("routerd", "syntrop-router")):
        assert owners[f"/var/lib/syntrop/{name}"].startswith(f"{user} "), owners
    assert owners["/var/lib/syntrop/inferenced"].startswith("root ")
    assert owners["/var/lib/syntrop/toold"].startswith("root ")
    assert owners["/var/lib/syntrop/sentry"].startswith("root ")


# --- Type=notify and the watchdog ---------------------------------------------


def test_sentry_reaches_ready_and_keeps_the_watchdog_fed(instance: Instance) -> None:
    service = "systemd-sentry.service"
    dropin = f"/run/systemd/system/{service}.d/50-system-test-watchdog.conf"
    instance.write(dropin, "[Service]\nWatchdogSec=2s\n")
    try:
        instance.systemctl("daemon-reload")
        # For Type=notify, start returns once the daemon sent READY=1.
        instance.systemctl("restart", service)
        shown = instance.show(
            service, "Type", "ActiveState", "SubState", "StatusText", "MainPID", "WatchdogUSec"
        )
        assert shown["Type"] == "notify"
        assert (shown["ActiveState"], shown["SubState"]) == ("active", "running")
        assert shown["StatusText"].startswith("Serving io.syntrop.Sentry1")
        assert shown["WatchdogUSec"] == "2s"
        pid = shown["MainPID"]

        def ping() -> str:
            return instance.show(service, "WatchdogTimestampMonotonic")[
                "WatchdogTimestampMonotonic"
            ]

        first = wait_until("a WATCHDOG=1", lambda: ping() != "0" and ping(), timeout=5)
        second = wait_until("another WATCHDOG=1", lambda: ping() != first and ping(), timeout=5)
        wait_until("a third WATCHDOG=1", lambda: ping() not in (first, second), timeout=5)
        after = instance.show(service, "MainPID", "NRestarts", "ActiveState")
        assert after == {"MainPID": pid, "NRestarts": "0", "ActiveState": "active"}
    finally:
        instance.run(["rm", "-rf", str(Path(dropin).parent)])
        instance.systemctl("daemon-reload")
        instance.systemctl("restart", service)


def test_sentry_does_not_exit_on_idle(instance: Instance) -> None:
    shown = instance.show("systemd-sentry.service", "ExecStart")
    assert "--idle-timeout=0" in shown["ExecStart"]


# --- idle exit ----------------------------------------------------------------


def test_idle_exit_and_reactivation(instance: Instance) -> None:
    daemon = next(d for d in DAEMONS if d.program == "modeld")
    service = unit(daemon)
    dropin = f"/run/systemd/system/{service}.d/50-system-test-idle.conf"
    instance.write(dropin, "[Service]\nEnvironment=SYNTROP_IDLE_TIMEOUT=1\n")
    try:
        instance.systemctl("daemon-reload")
        instance.systemctl("stop", service)
        get_info(instance, daemon)
        instance.wait_for_unit(service, ActiveState="active")
        first = instance.show(service, "InvocationID", "MainPID")

        # Nothing connected: it exits by itself, cleanly; the socket stays.
        instance.wait_for_unit(service, timeout=15, ActiveState="inactive")
        ended = instance.show(service, "Result", "ExecMainStatus", "NRestarts")
        assert ended == {"Result": "success", "ExecMainStatus": "0", "NRestarts": "0"}
        assert instance.show(f"{daemon.program}.socket", "SubState")["SubState"] == "listening"

        assert get_info(instance, daemon)["product"] == "modeld"
        instance.wait_for_unit(service, ActiveState="active")
        second = instance.show(service, "InvocationID", "MainPID")
        assert second["InvocationID"] != first["InvocationID"]
        assert second["MainPID"] != "0"
    finally:
        instance.run(["rm", "-rf", str(Path(dropin).parent)])
        instance.systemctl("daemon-reload")
        instance.systemctl("stop", service)


# --- varlinkctl ---------------------------------------------------------------


@pytest.mark.parametrize("daemon", DAEMONS, ids=IDS)
def test_varlinkctl_info(instance: Instance, varlinkctl_bin: str, daemon: Daemon) -> None:
    result = varlinkctl(varlinkctl_bin, "info", address(instance, daemon))
    assert result.returncode == 0, result.stderr
    assert re.search(rf"^\s*Product: {re.escape(daemon.program)}$", result.stdout, re.M)
    assert re.search(rf"^\s*(Interfaces:)?\s*{re.escape(daemon.interface)}$", result.stdout, re.M)


@pytest.mark.parametrize("daemon", DAEMONS, ids=IDS)
def test_varlinkctl_introspect_shows_the_documented_contract(
    instance: Instance, varlinkctl_bin: str, declared: dict[str, typing.Any], daemon: Daemon
) -> None:
    result = varlinkctl(varlinkctl_bin, "introspect", address(instance, daemon), daemon.interface)
    assert result.returncode == 0, result.stderr
    shown = {line.strip() for line in result.stdout.splitlines()}
    idl = declared[daemon.program]["idl"].splitlines()
    # varlinkctl's formatter drops comment lines with no text ("#").
    comments = [
        line.strip() for line in idl if line.strip().startswith("#") and line.strip() != "#"
    ]
    assert len(comments) > 5, f"{daemon.interface} declares almost no doc comments"
    missing = [line for line in comments if line not in shown]
    assert not missing, f"doc comments missing from introspection: {missing[:5]}"
    assert f"interface {daemon.interface}" in shown


def test_varlinkctl_call_getinfo(instance: Instance, varlinkctl_bin: str) -> None:
    daemon = DAEMONS[0]
    result = varlinkctl(
        varlinkctl_bin, "call", address(instance, daemon), "org.varlink.service.GetInfo", "{}"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["product"] == daemon.program


#: Run inside the instance by the installed interpreter: what the installed
#: code declares (each contract as rendered, with its doc comments) and which
#: methods it does not implement yet (the service class inherits the
#: contract's stub), with parameters that pass validation. Asking the
#: installed code, not the checkout, keeps this right while the checkout is
#: being edited.
DECLARED = r"""
import collections.abc, importlib, inspect, json, types, typing
from syntrop.cli.launcher import DAEMONS
from syntrop.interfaces.catalog import ALL

def placeholder(annotation):
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arguments = typing.get_args(annotation)
        return None if type(None) in arguments else placeholder(arguments[0])
    simple = {str: "x", int: 0, float: 0.0, bool: False}
    if annotation in simple:
        return simple[annotation]
    if typing.get_origin(annotation) in (list, dict):
        return typing.get_origin(annotation)()
    raise LookupError(annotation)

declared = {}
for daemon in DAEMONS:
    contract = next(c for c in ALL if c.name == daemon.interface)
    entry = declared[daemon.program] = {
        "idl": contract.render_interface_description(), "unimplemented": []
    }
    try:
        module = importlib.import_module(daemon.module + ".service")
    except Exception as error:  # that daemon's own tests say what is wrong
        entry["import_error"] = repr(error)
        continue
    services = [v for v in vars(module).values()
                if isinstance(v, type) and issubclass(v, contract) and v is not contract]
    if len(services) != 1:
        continue
    for name, raw in contract.contract_methods():
        if getattr(services[0], name) is not vars(contract).get(name):
            continue
        hints = typing.get_type_hints(raw)
        returns = typing.get_origin(hints.get("return"))
        stream = isinstance(returns, type) and issubclass(returns, collections.abc.AsyncIterator)
        try:
            parameters = {
                p.name: placeholder(hints[p.name])
                for p in inspect.signature(raw).parameters.values()
                if p.name != "self" and p.default is inspect.Parameter.empty
            }
        except LookupError:
            continue
        entry["unimplemented"].append(
            {"method": daemon.interface + "." + name, "stream": stream, "parameters": parameters}
        )
print(json.dumps(declared))
"""


@pytest.fixture(scope="module")
def declared(instance: Instance) -> dict[str, typing.Any]:
    result = instance.run(["/opt/syntrop/bin/python", "-c", DECLARED])
    return typing.cast(dict[str, typing.Any], json.loads(result.stdout))


def test_varlinkctl_call_of_an_unknown_method(instance: Instance, varlinkctl_bin: str) -> None:
    daemon = DAEMONS[0]
    result = varlinkctl(
        varlinkctl_bin, "call", address(instance, daemon), f"{daemon.interface}.NoSuchMethod", "{}"
    )
    assert result.returncode != 0
    assert "org.varlink.service.MethodNotFound" in result.stderr, result.stderr


@pytest.mark.parametrize("daemon", DAEMONS, ids=IDS)
def test_varlinkctl_exec_runs_the_installed_daemon(
    instance: Instance, varlinkctl_bin: str, daemon: Daemon
) -> None:
    """`varlinkctl call exec:PROGRAM` hands the daemon a connected socket,
    inside the instance, with the program scripts/install put in place."""
    result = instance.run(
        [
            varlinkctl_bin,
            "call",
            f"exec:/usr/local/bin/{daemon.program}",
            "org.varlink.service.GetInfo",
            "{}",
        ],
        timeout=30,
    )
    assert json.loads(result.stdout)["product"] == daemon.program
