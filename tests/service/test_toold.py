"""toold over its real activated socket: the tool catalogue, every kind of
bad input (declared error, nothing on disk changed, audited), the caller
check, path safety, and the sandbox refusal. No systemd answers here (its
D-Bus address points at nothing), so what needs PID 1 is refused with
SystemdUnavailable; the real D-Bus/systemd behaviour is the system tier's."""

import contextlib
import json
import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import varlink

from tests.support import Activated, activated, declared_error, varlink_call

NAME = "io.syntrop.Tool1"


@contextlib.contextmanager
def toold(config: str = "") -> Iterator[tuple[Activated, Path]]:
    """toold in a world-searchable root (so another uid can reach its socket),
    its unit_dirs and cache_root inside that root."""
    root = Path(tempfile.mkdtemp(prefix="syntrop-toold-"))
    try:
        os.chmod(root, 0o755)
        for name in ("config", "etc", "run-units", "cache"):
            (root / name).mkdir()
        (root / "config" / "toold.toml").write_text(
            f'unit_dirs = ["{root}/etc", "{root}/run-units"]\ncache_root = "{root}/cache"\n'
            f'dbus_address = "unix:path={root}/no-bus"\n{config}')
        with activated("toold", root) as daemon:
            os.chmod(root / "run", 0o755)
            os.chmod(daemon.socket, 0o666)
            call(daemon, "ListTools")  # systemd-socket-activate execs toold now
            yield daemon, root
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Activated, Path]]:
    with toold() as pair:
        yield pair


def call(daemon: Activated, method: str, **params: Any) -> Any:
    return varlink_call(daemon.address, NAME, method, **params)


def error_of(daemon: Activated, tool: Any, parameters: Any, dry_run: bool = False
             ) -> tuple[str, dict[str, Any]]:
    return declared_error(call, daemon, "Execute", tool=tool, parameters=parameters,
                          dry_run=dry_run)


def tree(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Everything under root's etc, run-units and cache: what must not change."""
    found: dict[str, tuple[int, bytes | str]] = {}
    for top in ("etc", "run-units", "cache"):
        for path in sorted((root / top).rglob("*")):
            info = path.lstat()
            content: bytes | str = os.readlink(path) if path.is_symlink() else (
                path.read_bytes() if path.is_file() else b"")
            found[str(path)] = (info.st_mode, content)
    return found


def test_list_tools_describes_the_seven_tools(served: tuple[Activated, Path]) -> None:
    daemon, _ = served
    tools = {t["name"]: t for t in call(daemon, "ListTools")["tools"]}
    assert set(tools) == {"daemon_reload", "unit_restart", "revert_dropin", "clear_cache",
                          "revert_config", "free_space", "downgrade_package"}
    assert [p["name"] for p in tools["downgrade_package"]["parameters"]] == [
        "unit", "package", "health_window_sec"]
    assert tools["downgrade_package"]["risk"] == "remediation"
    assert tools["free_space"]["reversible"] is False
    assert [p["name"] for p in tools["free_space"]["parameters"]] == ["unit", "path"]
    assert tools["revert_dropin"]["reversible"] is True
    assert tools["revert_dropin"]["sandbox"] == ["bubblewrap", "landlock", "seccomp"]
    assert tools["daemon_reload"]["sandbox"] == [] and tools["daemon_reload"]["risk"] == "safe"
    unit = next(p for p in tools["unit_restart"]["parameters"] if p["name"] == "unit")
    assert unit["required"] is True and unit["type"] == "str" and unit["pattern"]
    scope = next(p for p in tools["revert_dropin"]["parameters"] if p["name"] == "scope")
    assert scope["choices"] == ["persistent", "runtime"]


BAD_INPUT = [
    ("no_such_tool", {}, f"{NAME}.ToolNotFound", {"tool": "no_such_tool"}),
    ("unit_restart", {"unit": "a.service", "force": True}, f"{NAME}.InvalidArgument",
     {"tool": "unit_restart", "parameter": "force", "reason": "unknown parameter"}),
    ("unit_restart", {}, f"{NAME}.InvalidArgument",
     {"tool": "unit_restart", "parameter": "unit", "reason": "required"}),
    ("unit_restart", {"unit": 7}, f"{NAME}.InvalidArgument",
     {"tool": "unit_restart", "parameter": "unit", "reason": "must be str"}),
    ("unit_restart", {"unit": "a.service", "timeout_sec": "9"}, f"{NAME}.InvalidArgument",
     {"tool": "unit_restart", "parameter": "timeout_sec", "reason": "must be int"}),
    ("unit_restart", ["a.service"], f"{NAME}.InvalidArgument",
     {"tool": "unit_restart", "parameter": "parameters", "reason": "not an object"}),
    ("revert_dropin", {"unit": "../../etc/passwd"}, f"{NAME}.InvalidArgument", None),
    ("revert_dropin", {"unit": "/etc/systemd/system/a.service"}, f"{NAME}.InvalidArgument",
     None),
    ("revert_dropin", {"unit": "foo.service/../../etc"}, f"{NAME}.InvalidArgument", None),
    ("revert_dropin", {"unit": "a.service", "scope": "../x"}, f"{NAME}.InvalidArgument", None),
    ("clear_cache", {"unit": "dbus.service"}, f"{NAME}.UnitNotAllowed", {"unit": "dbus.service"}),
    ("free_space", {"unit": "a.service", "path": "../var"}, f"{NAME}.InvalidArgument",
     {"tool": "free_space", "parameter": "path", "reason": "must be an absolute path"}),
    ("free_space", {"unit": "a.service"}, f"{NAME}.InvalidArgument",
     {"tool": "free_space", "parameter": "path", "reason": "required"}),
    ("downgrade_package", {"unit": "a.service", "package": "../x"}, f"{NAME}.InvalidArgument",
     {"tool": "downgrade_package", "parameter": "package",
      "reason": "does not match its pattern"}),
    ("downgrade_package", {"unit": "a.service", "package": "pl-tool:amd64"},
     f"{NAME}.InvalidArgument", {"tool": "downgrade_package", "parameter": "package",
                                 "reason": "does not match its pattern"}),
    ("downgrade_package", {"unit": "a.service"}, f"{NAME}.InvalidArgument",
     {"tool": "downgrade_package", "parameter": "package", "reason": "required"}),
    ("downgrade_package", {"unit": "dbus.service", "package": "dbus"},
     f"{NAME}.UnitNotAllowed", {"unit": "dbus.service"}),
    ("unit_restart", {"unit": "toold.service"}, f"{NAME}.UnitNotAllowed",
     {"unit": "toold.service"}),
    ("unit_restart", {"unit": "a.socket"}, f"{NAME}.UnitNotAllowed", {"unit": "a.socket"}),
    ("unit_restart", {"unit": "a.service"}, f"{NAME}.SystemdUnavailable", None),
    ("daemon_reload", {}, f"{NAME}.SystemdUnavailable", None),
]


@pytest.mark.parametrize(("tool", "parameters", "error", "fields"), BAD_INPUT,
                         ids=[f"{t}-{e.rsplit('.', 1)[1]}-{i}"
                              for i, (t, _, e, _) in enumerate(BAD_INPUT)])
def test_bad_input_gets_a_declared_error_changes_nothing_and_is_audited(
        served: tuple[Activated, Path], tool: str, parameters: Any, error: str,
        fields: dict[str, Any] | None) -> None:
    daemon, root = served
    (root / "etc" / "a.service.d").mkdir(exist_ok=True)
    (root / "etc" / "a.service.d" / "10.conf").write_text("[Service]\nNice=1\n")
    before = tree(root)
    for dry_run in (False, True):
        got, params = error_of(daemon, tool, parameters, dry_run)
        assert got == error
        if fields is not None:
            assert params == fields
        if got.endswith("InvalidArgument"):
            assert params["parameter"] in ("unit", "scope", "force", "timeout_sec", "path",
                                           "package", "parameters")
        record = call(daemon, "GetAudit", limit=1)["records"][-1]
        assert record["tool"] == tool and record["error"] == error
        assert (record["decision"], record["outcome"]) == ("refused", "not_run")
        assert record["dry_run"] is dry_run
    assert tree(root) == before
    assert daemon.process.poll() is None


BAD_PLANS = [
    ([], "no_steps", None),
    ([{"tool": "unit_restart", "parameters": {"unit": "a.service"}}] * 5, "too_many_steps",
     None),
    ([{"tool": "daemon_reload", "parameters": {}},
      {"tool": "format_disk", "parameters": {"unit": "a.service"}}], "unknown_tool", 1),
    ([{"tool": "daemon_reload", "parameters": {}},
      {"tool": "unit_restart", "parameters": {"unit": "b.service"}}], "other_unit", 1),
    ([{"tool": "unit_restart", "parameters": {"unit": "a.service", "force": True}}],
     "invalid_step", 0),
    ([{"tool": "revert_dropin", "parameters": {"unit": "a.service", "scope": "../x"}}],
     "invalid_step", 0),
]


@pytest.mark.parametrize(("steps", "reason", "step"), BAD_PLANS,
                         ids=[reason for _, reason, _ in BAD_PLANS])
def test_a_bad_plan_is_refused_whole_before_anything_runs_and_audited(
        served: tuple[Activated, Path], steps: list[dict[str, Any]], reason: str,
        step: int | None) -> None:
    daemon, root = served
    (root / "etc" / "a.service.d").mkdir(exist_ok=True)
    (root / "etc" / "a.service.d" / "10.conf").write_text("[Service]\nNice=1\n")
    before, audited = tree(root), len(call(daemon, "GetAudit", limit=1000)["records"])
    with pytest.raises(varlink.VarlinkError) as caught:
        call(daemon, "ExecutePlan", unit="a.service", steps=steps)
    assert caught.value.error() == f"{NAME}.PlanRefused"
    assert caught.value.parameters()["reason"] == reason
    assert caught.value.parameters()["step"] == step
    records = call(daemon, "GetAudit", limit=1000)["records"]
    assert len(records) == audited + 1  # one record for the plan, none for a step
    assert (records[-1]["tool"], records[-1]["decision"], records[-1]["outcome"]) == \
        ("plan", "refused", "not_run")
    assert records[-1]["error"] == f"{NAME}.PlanRefused"
    assert tree(root) == before
    for allowed, unit in ((False, "toold.service"), (False, "a.socket")):
        with pytest.raises(varlink.VarlinkError) as caught:
            call(daemon, "ExecutePlan", unit=unit,
                 steps=[{"tool": "unit_restart", "parameters": {"unit": unit}}])
        assert caught.value.parameters()["reason"] == "unit_not_allowed", allowed


def test_a_plan_stops_at_its_first_failed_step(served: tuple[Activated, Path]) -> None:
    """No systemd here: daemon_reload is refused when it comes to run, and
    the step after it is not run."""
    daemon, _ = served
    result = call(daemon, "ExecutePlan", unit="a.service", steps=[
        {"tool": "daemon_reload", "parameters": {}},
        {"tool": "unit_restart", "parameters": {"unit": "a.service"}}])
    assert result["outcome"] == "failed"
    first, second = result["steps"]
    assert (first["tool"], first["outcome"]) == ("daemon_reload", "refused")
    assert first["error"] == f"{NAME}.SystemdUnavailable"
    assert (second["tool"], second["outcome"], second.get("action_id")) == \
        ("unit_restart", "not_run", None)


def test_a_symlinked_dropin_dir_is_refused_and_left_alone(
        served: tuple[Activated, Path]) -> None:
    daemon, root = served
    elsewhere = root / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    (elsewhere / "precious.conf").write_text("keep\n")
    link = root / "etc" / "evil.service.d"
    link.symlink_to(elsewhere)
    try:
        before = tree(root), (elsewhere / "precious.conf").read_text()
        for dry in (True, False):
            assert error_of(daemon, "revert_dropin", {"unit": "evil.service"}, dry) == (
                f"{NAME}.UnsafePath", {"path": str(link), "reason": "is a symlink"})
        assert (tree(root), (elsewhere / "precious.conf").read_text()) == before
        record = call(daemon, "GetAudit", unit="evil.service", limit=1)["records"][-1]
        assert record["error"] == f"{NAME}.UnsafePath"
    finally:
        link.unlink()


def test_a_runtime_scope_dropin_dir_is_checked_too(served: tuple[Activated, Path]) -> None:
    daemon, root = served
    (root / "run-units" / "r.service.d").write_text("not a directory")
    try:
        assert error_of(daemon, "revert_dropin", {"unit": "r.service", "scope": "runtime"},
                        True) == (f"{NAME}.UnsafePath", {
                            "path": str(root / "run-units" / "r.service.d"),
                            "reason": "is not a directory"})
    finally:
        (root / "run-units" / "r.service.d").unlink()


def raw_call_as(uid: int, path: Path, message: dict[str, Any]) -> dict[str, Any]:
    """One Varlink call from a child process running as `uid`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(10)
                sock.connect(str(path))
                sock.sendall(json.dumps(message).encode() + b"\0")
                reply = b""
                while not reply.endswith(b"\0"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
            os.write(write, reply.rstrip(b"\0"))
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return dict(json.loads(data))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to call as another uid")
def test_an_unauthorized_uid_is_refused_and_audited(served: tuple[Activated, Path]) -> None:
    daemon, _ = served
    reply = raw_call_as(65534, daemon.socket, {
        "method": f"{NAME}.Execute",
        "parameters": {"tool": "daemon_reload", "parameters": {}, "dry_run": True}})
    assert reply.get("error") == "io.syntrop.Tool1.NotAuthorized", reply
    reply = raw_call_as(65534, daemon.socket, {"method": f"{NAME}.GetAudit", "parameters": {}})
    assert reply.get("error") == "io.syntrop.Tool1.NotAuthorized", reply
    listed = raw_call_as(65534, daemon.socket, {"method": f"{NAME}.ListTools",
                                                "parameters": {}})
    assert len(listed["parameters"]["tools"]) == 7
    record = call(daemon, "GetAudit", limit=1)["records"][-1]
    assert (record["uid"], record["decision"], record["error"]) == (
        65534, "denied", "io.syntrop.Tool1.NotAuthorized")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to call as another uid")
def test_the_configured_sentry_uid_may_execute() -> None:
    with toold("sentry_uid = 65534\n") as (daemon, _):
        reply = raw_call_as(65534, daemon.socket, {
            "method": f"{NAME}.Execute",
            "parameters": {"tool": "daemon_reload", "parameters": {}, "dry_run": True}})
        assert reply.get("error") == f"{NAME}.SystemdUnavailable", reply


def test_a_missing_sandbox_layer_refuses_unless_weaker_is_allowed() -> None:
    missing = '[sandbox]\nbwrap = "/nonexistent/bwrap"\n'
    with toold(missing) as (daemon, root):
        (root / "etc" / "a.service.d").mkdir()
        error, params = error_of(daemon, "revert_dropin", {"unit": "a.service"}, True)
        assert error == f"{NAME}.SandboxUnavailable"
        assert params["layer"] == "bubblewrap" and "not found" in params["reason"]
        # daemon_reload starts no tool process: no sandbox needed, so it gets further
        assert error_of(daemon, "daemon_reload", {}, True)[0] == f"{NAME}.SystemdUnavailable"
    with toold(missing + "allow_weaker = true\n") as (daemon, root):
        (root / "etc" / "a.service.d").mkdir()
        assert error_of(daemon, "revert_dropin", {"unit": "a.service"}, True)[0] == \
            f"{NAME}.SystemdUnavailable"


def test_get_audit_validates_its_parameters(served: tuple[Activated, Path]) -> None:
    daemon, _ = served
    for params in ({"limit": 0}, {"limit": 10**9}, {"unit": "x" * 1000}):
        with pytest.raises(varlink.VarlinkError) as caught:
            call(daemon, "GetAudit", **params)
        assert caught.value.error() == "org.varlink.service.InvalidParameter"
    records = call(daemon, "GetAudit", limit=5)["records"]
    assert [r["id"] for r in records] == sorted(r["id"] for r in records)


def test_history_comes_from_a_real_contextd(tmp_path: Path) -> None:
    """toold reads contextd's timeline (ListEvents + GetEvent) and undoes it:
    a created drop-in is removed, a modified one gets its old text back."""
    import asyncio
    import time

    from syntrop.toold import dropins
    from syntrop.toold.audit import Audit
    from syntrop.toold.config import parse
    from syntrop.toold.context import Context

    (tmp_path / "config").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "config" / "contextd.toml").write_text(f'unit_dirs = ["{tmp_path}/etc"]\n')
    directory = tmp_path / "etc" / "h.service.d"
    with activated("contextd", tmp_path, stderr=subprocess.DEVNULL) as contextd:
        with varlink.Client(address=contextd.address) as client, \
                client.open("io.syntrop.Context1") as context1:
            context1.GetStatus()  # watching from now on
            directory.mkdir()
            (directory / "10.conf").write_text("[Service]\nNice=1\n")
            time.sleep(2.5)  # a separate change
            (directory / "10.conf").write_text("[Service]\nNice=19\n")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(
                    e["action"] == "modified"
                    for e in context1.ListEvents(kind="dropin")["events"]):
                time.sleep(0.1)
        audit = Audit(tmp_path / "toold.db")
        try:
            context = Context(parse({"context_socket": str(contextd.socket)}), audit)
            history = asyncio.run(context.history(str(directory)))
            assert history is not None
            assert [c.action for c in history][-1] == "modified", history
            _, current = dropins.read_dir(str(directory))
            target = dropins.undo(current, history)
            assert target is not None
            assert dropins.text_of(target[0]) == "[Service]\nNice=1\n"
        finally:
            audit.close()
