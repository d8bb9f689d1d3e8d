"""toold's tool process under each sandbox layer, for real: the same helper
and the same bubblewrap/Landlock/seccomp code toold runs, each layer alone
and all together. An action trying to write outside its path, open a socket
or exec a binary fails, and each layer stops what it is there to stop."""

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from syntrop.system import sandbox
from syntrop.system.sandbox import Layers
from syntrop.toold.audit import Audit
from syntrop.toold.config import parse
from syntrop.toold.context import HELPER, Context

AVAILABLE = sandbox.available()
#: A path in the host's /tmp that only an unconfined probe may create.
ESCAPE = f"/tmp/syntrop-toold-escape-{os.getpid()}"


def need(*layers: str) -> None:
    for layer in layers:
        if not getattr(AVAILABLE, layer):
            pytest.skip(f"{layer} unavailable here: {AVAILABLE.reasons.get(layer)}")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A writable target, a sibling outside it, a TCP listener on the host."""
    target, outside = tmp_path / "target", tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield {"target": target, "outside": outside, "port": listener.getsockname()[1]}


def probe(world: dict[str, Any], layers: Layers) -> dict[str, str]:
    request = {
        "action": "probe",
        "write_paths": [str(world["target"] / "ok"), str(world["outside"] / "escape"),
                        ESCAPE, "/etc/syntrop-escape"],
        "socket": True, "exec": True, "tcp_port": world["port"],
        "unix_socket": str(world["target"] / "nothing"),
    }
    reply = asyncio.run(sandbox.run(HELPER, request, writable=[str(world["target"])],
                                    layers=layers))
    assert reply["ok"], reply
    results: dict[str, str] = reply["results"]
    return {key.replace(str(world["target"]), "T").replace(str(world["outside"]), "O")
            .replace(ESCAPE, "/tmp/escape"): value for key, value in results.items()}


def test_unconfined_baseline_can_do_everything(world: dict[str, Any]) -> None:
    """The probe itself works: without layers each attempt succeeds (so the
    refusals below are the layers' doing)."""
    got = probe(world, Layers(bubblewrap=False, landlock=False, seccomp=False))
    assert got["write:T/ok"] == got["write:O/escape"] == got["write:/tmp/escape"] == "ok"
    assert (got["socket"], got["connect_tcp"], got["exec"]) == ("ok", "ok", "ok")
    os.unlink(ESCAPE)


def test_bubblewrap_alone_read_only_root_and_no_network(world: dict[str, Any]) -> None:
    need("bubblewrap")
    got = probe(world, Layers(bubblewrap=True, landlock=False, seccomp=False))
    assert got["write:T/ok"] == "ok"
    assert got["write:/etc/syntrop-escape"] == "EROFS"
    assert got["write:O/escape"] in ("EROFS", "ENOENT")
    assert got["connect_tcp"] == "ECONNREFUSED"  # its own network namespace: nobody listens
    assert not (world["outside"] / "escape").exists()
    assert not Path(ESCAPE).exists()  # /tmp is its own tmpfs


def test_landlock_alone_confines_writes_and_exec(world: dict[str, Any]) -> None:
    need("landlock")
    got = probe(world, Layers(bubblewrap=False, landlock=True, seccomp=False))
    assert got["write:T/ok"] == "ok"
    assert got["write:O/escape"] == got["write:/tmp/escape"] == "EACCES"
    assert got["exec"] == "EACCES"
    assert got["connect_tcp"] == "ok"  # not Landlock's job (network rules are not used)
    assert not (world["outside"] / "escape").exists()


def test_seccomp_alone_forbids_sockets_and_exec(world: dict[str, Any]) -> None:
    need("seccomp")
    got = probe(world, Layers(bubblewrap=False, landlock=False, seccomp=True))
    assert got["socket"] == got["connect_unix"] == got["connect_tcp"] == "EPERM"
    assert got["exec"] == "EPERM"
    assert got["write:O/escape"] == "ok"  # not seccomp's job
    (world["outside"] / "escape").unlink()
    os.unlink(ESCAPE)


def test_all_layers_together(world: dict[str, Any]) -> None:
    need("bubblewrap", "landlock", "seccomp")
    reply = asyncio.run(sandbox.run(HELPER, {"action": "probe", "socket": True, "exec": True,
                                             "write_paths": [str(world["outside"] / "x")]},
                                    writable=[str(world["target"])], layers=Layers()))
    assert reply["applied"] == ["landlock", "seccomp"] and reply["bubblewrap"] is True
    results = reply["results"]
    assert results["socket"] == "EPERM" and results["exec"] in ("EPERM", "EACCES")
    assert results[f"write:{world['outside'] / 'x'}"] != "ok"


def test_apply_writes_atomically_and_never_follows_symlinks(world: dict[str, Any]) -> None:
    need("bubblewrap", "landlock", "seccomp")
    target, outside = world["target"], world["outside"]
    (outside / "victim").write_text("untouched\n")
    (target / "10.conf").symlink_to(outside / "victim")
    entries = [{"name": "10.conf", "state": "file", "content": "W1NlcnZpY2VdCg==",
                "mode": 0o640, "uid": os.getuid(), "gid": os.getgid()},
               {"name": "../escape.conf", "state": "file", "content": ""}]
    reply = asyncio.run(sandbox.run(HELPER, {"action": "apply", "directory": str(target),
                                             "entries": entries[:1]},
                                    writable=[str(target)], layers=Layers()))
    assert reply["ok"], reply
    assert (target / "10.conf").read_text() == "[Service]\n"
    assert not (target / "10.conf").is_symlink()
    assert (target / "10.conf").stat().st_mode & 0o777 == 0o640
    assert (outside / "victim").read_text() == "untouched\n"
    bad = asyncio.run(sandbox.run(HELPER, {"action": "apply", "directory": str(target),
                                           "entries": entries[1:]},
                                  writable=[str(target)], layers=Layers()))
    assert not bad["ok"] and "bad file name" in bad["error"]
    assert sorted(os.listdir(target)) == ["10.conf"]


def test_clear_removes_contents_not_symlink_targets(world: dict[str, Any]) -> None:
    need("bubblewrap", "landlock", "seccomp")
    target, outside = world["target"], world["outside"]
    (outside / "keep").write_text("keep\n")
    (target / "a" / "b").mkdir(parents=True)
    (target / "a" / "b" / "f").write_text("12345")
    (target / "link").symlink_to(outside / "keep")
    (target / "dirlink").symlink_to(outside)
    reply = asyncio.run(sandbox.run(HELPER, {"action": "clear", "directory": str(target)},
                                    writable=[str(target)], layers=Layers()))
    assert reply["ok"], reply
    assert os.listdir(target) == []
    assert (outside / "keep").read_text() == "keep\n"
    assert reply["removed_files"] == 3


def test_the_helper_refuses_a_symlinked_directory(world: dict[str, Any]) -> None:
    link = world["target"] / "d.service.d"
    link.symlink_to(world["outside"])
    reply = asyncio.run(sandbox.run(HELPER, {"action": "clear", "directory": str(link)},
                                    writable=[], layers=Layers(bubblewrap=False)))
    assert not reply["ok"] and "symlink" in reply["error"]


def test_weaker_mode_reports_only_the_layers_applied(tmp_path: Path,
                                                     world: dict[str, Any]) -> None:
    need("landlock", "seccomp")
    config = parse({"sandbox": {"bwrap": "/nonexistent/bwrap", "allow_weaker": True}})
    audit = Audit(tmp_path / "toold.db")
    context = Context(config, audit)
    try:
        reply, applied = asyncio.run(context.tool_process(
            {"action": "probe", "write_paths": [str(world["outside"] / "x")]},
            [str(world["target"])]))
        assert applied == ["landlock", "seccomp"]
        assert reply["results"][f"write:{world['outside'] / 'x'}"] == "EACCES"
    finally:
        audit.close()
