"""modeld under a real systemd: the installed, sandboxed modeld.service
(User=syntrop, PrivateNetwork, ProtectHome, ProtectProc=invisible,
MemoryDenyWriteExecute, SystemCallFilter) stores what `syn pull` on the host
fetches from a loopback registry and hands it over through a pipe; imports
a descriptor; passes a read-only descriptor back; refuses bad identifiers."""

import asyncio
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import varlink

from syntrop.interfaces.model import Model1
from syntrop.varlink.client import connect
from tests.system.instance import Instance
from tests.unit.modeld.ggufs import write_tiny
from tests.unit.modeld.registry import LoopbackRegistry, serving

NAME = "io.syntrop.Model1"


def address(instance: Instance) -> str:
    return f"unix:{instance.host_path(f'/run/syntrop/{NAME}')}"


def call(instance: Instance, method: str, **params: object) -> object:
    with varlink.Client(address=address(instance)) as client, client.open(NAME) as proxy:
        return getattr(proxy, method)(**params)


def syn(instance: Instance, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "cli-config").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SYNTROP_"))}
    env.update(RUNTIME_DIRECTORY=str(instance.host_path("/run/syntrop")),
               CONFIGURATION_DIRECTORY=str(tmp / "cli-config"))
    return subprocess.run([sys.executable, "-m", "syntrop.cli.syn", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[tuple[LoopbackRegistry, str]]:
    model = tmp_path / "tiny.gguf"
    digest = write_tiny(model, floats=500_000)
    with serving(tmp_path / "srv") as server:
        server.add_hf("org/Tiny-GGUF", "tiny.Q8_0.gguf", model)
        (tmp_path / "cli-config").mkdir()
        (tmp_path / "cli-config" / "pull.toml").write_text(
            f'[hf]\nendpoint = "{server.url}"\n[network]\nallow = ["127.0.0.0/8"]\n')
        yield server, digest


async def _open(instance: Instance, name: str) -> tuple[bytes, int]:
    async with await connect(Model1, address=address(instance)) as model1:
        with await model1.OpenModel(name=name) as result:
            fd = result["fd"].fileno()
            import fcntl

            return os.pread(fd, 1 << 24, 0), fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE


def test_sandboxed_modeld_stores_a_pull_fed_from_the_host(
    instance: Instance, tmp_path: Path, registry: tuple[LoopbackRegistry, str]
) -> None:
    _server, digest = registry
    result = syn(instance, tmp_path, "pull", "hf://org/Tiny-GGUF/tiny.Q8_0.gguf")
    assert result.returncode == 0, result.stderr + instance.journal("modeld.service", 30)
    assert f"sha256:{digest}" in result.stdout
    model = call(instance, "Show", name="tiny:q8_0")["model"]  # type: ignore[index]
    assert (model["architecture"], model["quantization"]) == ("llama", "Q8_0")
    data, mode = asyncio.run(_open(instance, "tiny:q8_0"))
    assert hashlib.sha256(data).hexdigest() == digest and mode == os.O_RDONLY
    # A local file passed as a descriptor: modeld cannot see the host's /tmp.
    local = tmp_path / "local.gguf"
    local_digest = write_tiny(local, seed=5)
    result = syn(instance, tmp_path, "pull", str(local), "--name", "local")
    assert result.returncode == 0, result.stderr + instance.journal("modeld.service", 30)
    assert call(instance, "Show", name="local")["model"]["digest"] == local_digest  # type: ignore[index]
    store = instance.run(["find", "/var/lib/syntrop/models", "-type", "f"]).stdout
    assert f"blobs/sha256/{digest}" in store and f"blobs/sha256/{local_digest}" in store
    assert "by-name/tiny/q8_0.gguf" in store and "partial/" not in store


def test_sandboxed_modeld_refuses_bad_identifiers(instance: Instance) -> None:
    for bad in ("..", "a/b", "a\0b"):
        with pytest.raises(varlink.VarlinkError) as caught:
            call(instance, "Show", name=bad)
        assert caught.value.error() == f"{NAME}.InvalidIdentifier"
    journal = instance.journal("modeld.service", 200)
    assert "Traceback" not in journal, journal
