"""`syn pull` end to end: the real command, the real modeld over its socket,
real HTTP servers on loopback in Hugging Face and ollama layouts, and the
faults the issue names: corruption, cuts, no Range, 404/401/500, wrong
digests, no space, concurrent pulls, kill -9."""

import contextlib
import hashlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.wire import wait_for
from tests.unit.modeld.ggufs import write_tiny
from tests.unit.modeld.harness import Store, modeld
from tests.unit.modeld.registry import LoopbackRegistry, serving

REF = "hf://org/Tiny-GGUF/tiny.Q8_0.gguf"
#: ~4 MiB: several pipe buffers and progress replies.
FLOATS = 1_000_000


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registries here are on loopback, which a pull refuses unless
    allowed: `syn` inherits this (Store.env)."""
    monkeypatch.setenv("SYNTROP_PULL_ALLOW", "127.0.0.0/8")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("models") / "tiny.gguf"
    return path, write_tiny(path, floats=FLOATS)


@pytest.fixture
def registry(tmp_path: Path, model_file: tuple[Path, str]) -> Iterator[LoopbackRegistry]:
    with serving(tmp_path / "srv") as server:
        server.add_hf("org/Tiny-GGUF", "tiny.Q8_0.gguf", model_file[0])
        yield server


@pytest.fixture
def store(tmp_path: Path, registry: LoopbackRegistry) -> Iterator[Store]:
    pull = f'[hf]\nendpoint = "{registry.url}"\n[ollama]\nendpoint = "{registry.url}"\n'
    with modeld(tmp_path, pull=pull) as running_store:
        yield running_store
        running_store.daemon.assert_healthy()


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The failure of a `syn` run: status 1, one `syn: …` line, no traceback."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("syn: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_pull_hf_shows_metadata_then_a_second_pull_fetches_nothing(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    path, digest = model_file
    result = store.syn("pull", REF)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"pulled tiny:q8_0 sha256:{digest} ({path.stat().st_size / 2**20:.1f} MiB)")
    assert "pulling hf://org/Tiny-GGUF/tiny.Q8_0.gguf" in result.stderr
    model = store.syn_json("show", "tiny:q8_0")
    assert (model["architecture"], model["quantization"], model["digest"], model["source"]) == (
        "llama", "Q8_0", digest, REF)
    assert [r.range for r in registry.blob_gets()] == [None]
    again = store.syn_json("pull", REF, "--name", "second", "--pin")
    assert again["digest"] == digest and again["name"] == "second" and again["pinned"]
    assert len(registry.blob_gets()) == 1  # dedup: nothing fetched the second time
    assert store.visible() == [f"blobs/sha256/{digest}", "by-name/second/latest.gguf",
                               "by-name/tiny/q8_0.gguf"]
    assert store.partials() == []


def test_pull_ollama_from_the_configured_and_a_named_registry(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    path, digest = model_file
    registry.add_ollama("library", "tiny", "q8", path)
    model = store.syn_json("pull", "ollama://tiny:q8")
    assert (model["name"], model["tag"], model["digest"]) == ("tiny", "q8", digest)
    bare = store.syn_json("pull", "tiny:q8", "--name", "bare:q8")  # as ollama's CLI reads it
    assert (bare["digest"], bare["source"]) == (digest, "ollama://library/tiny:q8")
    named = store.syn_json("pull", f"ollama://{registry.host}/library/tiny:q8", "--insecure",
                           "--name", "other:q8")
    assert named["digest"] == digest
    result = store.syn("pull", "ollama://tiny:missing")
    assert "ollama://" in one_line_error(result) and "not found (HTTP 404)" in result.stderr


def test_pull_https_needs_and_checks_the_sha256(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    path, digest = model_file
    registry.add_file("tiny.gguf", path)
    url = f"{registry.url}/files/tiny.gguf"
    assert "pass --sha256" in one_line_error(store.syn("pull", url))
    assert registry.blob_gets() == []
    wrong = "ab" * 32
    line = one_line_error(store.syn("pull", url, "--sha256", wrong))
    assert f"expected {wrong}, got {digest}" in line and "nothing was stored" in line
    assert store.visible() == [] and store.partials() == []
    model = store.syn_json("pull", url, "--sha256", digest)
    assert (model["name"], model["digest"]) == ("tiny", digest)


def test_a_sha256_disagreeing_with_the_registry_is_refused_before_fetching(
    store: Store, registry: LoopbackRegistry
) -> None:
    line = one_line_error(store.syn("pull", REF, "--sha256", "cd" * 32))
    assert "the registry gives sha256" in line and "nothing was fetched" in line
    assert registry.blob_gets() == []


def test_pull_a_local_file_pinned(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "Local.Q8_0.gguf"
    digest = write_tiny(path, seed=7)
    model = store.syn_json("pull", str(path), "--pin")
    assert (model["name"], model["pinned"], model["digest"], model["source"]) == (
        "local.q8_0", True, digest, str(path))
    assert "not a model file" in one_line_error(store.syn("pull", "/etc/hostname"))
    assert "No such file" in one_line_error(store.syn("pull", str(tmp_path / "none.gguf")))


def test_a_corrupted_blob_is_rejected_and_nothing_is_visible(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    registry.corrupt = True
    line = one_line_error(store.syn("pull", REF))
    assert f"expected {model_file[1]}" in line and "nothing was stored" in line
    assert store.visible() == [] and store.partials() == [] and store.journal() == {}
    assert store.syn_json("list") == []


def test_a_cut_connection_is_resumed_with_range(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    registry.cut_after, registry.cuts = 1_500_000, 1
    model = store.syn_json("pull", REF)
    assert model["digest"] == model_file[1]
    gets = registry.blob_gets()
    assert len(gets) == 2 and gets[0].range is None
    assert gets[1].range is not None and int(gets[1].range[6:-1]) > 0


def test_without_retries_the_partial_is_kept_and_the_next_pull_resumes(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    registry.cut_after, registry.cuts = 1_500_000, 1
    line = one_line_error(store.syn("pull", REF, "--retries", "0"))
    assert "run the command again to resume" in line
    digest = model_file[1]
    assert store.visible() == [] and store.partials() == [digest]
    assert 0 < store.journal()[digest] <= 1_500_000
    model = store.syn_json("pull", REF)
    assert model["digest"] == digest
    assert registry.blob_gets()[-1].range == f"bytes={store_journal_offset(registry)}-"
    assert store.partials() == [] and store.journal() == {}


def store_journal_offset(registry: LoopbackRegistry) -> int:
    last = registry.blob_gets()[-1].range
    assert last is not None
    return int(last[6:-1])


def test_a_damaged_partial_is_discarded_and_the_pull_starts_over(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    registry.cut_after, registry.cuts = 1_500_000, 1
    one_line_error(store.syn("pull", REF, "--retries", "0"))
    digest = model_file[1]
    partial = store.directory / "partial" / digest
    with partial.open("r+b") as file:  # as a power loss might leave it
        file.seek(1000)
        file.write(b"\xff" * 100)
    result = store.syn("pull", REF)
    assert result.returncode == 0, result.stderr
    assert "do not match their SHA-256" in result.stderr
    assert "starting over from byte 0" in result.stderr
    assert [g.range is not None for g in registry.blob_gets()] == [False, True, False]
    assert store.syn_json("show", "tiny:q8_0")["digest"] == digest


def test_a_server_without_range_restarts_cleanly(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    registry.cut_after, registry.cuts = 1_500_000, 1
    one_line_error(store.syn("pull", REF, "--retries", "0"))
    registry.ranges = False
    result = store.syn("pull", REF)
    assert result.returncode == 0, result.stderr
    assert "ignores Range requests; starting over from byte 0" in result.stderr
    gets = registry.blob_gets()
    assert [g.range is not None for g in gets] == [False, True, False]
    model = store.syn_json("show", "tiny:q8_0")
    assert model["digest"] == model_file[1]


def test_http_errors_are_clear(store: Store, registry: LoopbackRegistry) -> None:
    line = one_line_error(store.syn("pull", "hf://org/Missing-GGUF/x.gguf"))
    assert line == ("syn: hf://org/Missing-GGUF/x.gguf: not found (HTTP 404) (no such file)")
    registry.token = "s3cret"
    line = one_line_error(store.syn("pull", REF))
    assert "not authorized (HTTP 401)" in line and "HF_TOKEN" in line
    assert store.syn_json("pull", REF, HF_TOKEN="s3cret")["name"] == "tiny"
    registry.token = None
    registry.fail["/org/Other-GGUF"] = 500
    started = time.monotonic()
    line = one_line_error(store.syn("pull", "hf://org/Other-GGUF/x.gguf", "--retries", "1"))
    assert "server error (HTTP 500)" in line
    assert time.monotonic() - started >= 0.5  # one retry, after a backoff
    registry.fail = {"/cdn/": 500}
    store.syn("rm", "tiny:q8_0")
    line = one_line_error(store.syn("pull", REF, "--retries", "0"))
    assert "server error (HTTP 500)" in line and "after 1 tries" in line
    assert store.visible() == []


def test_a_pull_larger_than_free_space_is_refused_before_any_byte(
    tmp_path: Path, registry: LoopbackRegistry
) -> None:
    pull = f'[hf]\nendpoint = "{registry.url}"\n'
    with modeld(tmp_path / "root", config="[store]\nmin_free_bytes = 1125899906842624\n",
                pull=pull) as store:
        line = one_line_error(store.syn("pull", REF))
        assert "not enough space in the model store" in line and "nothing was written" in line
        assert registry.blob_gets() == []
        assert store.visible() == [] and store.partials() == []
        store.daemon.assert_healthy()


def test_a_pull_larger_than_a_real_small_filesystem(
    tmp_path: Path, registry: LoopbackRegistry
) -> None:
    """The same on a real 2 MiB tmpfs holding the store."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        config = f'[store]\ndirectory = "{small}"\n'
        with modeld(tmp_path / "root", config=config,
                    pull=f'[hf]\nendpoint = "{registry.url}"\n') as store:
            line = one_line_error(store.syn("pull", REF))
            assert "not enough space" in line
            assert registry.blob_gets() == []
            assert sorted(p.name for p in (small / "blobs" / "sha256").iterdir()) == []
            assert list((small / "partial").iterdir()) == []
            store.daemon.assert_healthy()
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_two_pulls_of_one_model_at_once_store_one_blob(
    store: Store, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    registry.pause_after = 1_000_000
    second: subprocess.Popen[str] | None = None
    first = subprocess.Popen(
        [sys.executable, "-m", "syntrop.cli.syn", "pull", REF, "--json"], env=store.env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert registry.paused.wait(20), "the first pull never reached the server"
        second = subprocess.Popen(
            [sys.executable, "-m", "syntrop.cli.syn", "pull", REF, "--name", "again"],
            env=store.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert second.stderr is not None
        for line in second.stderr:  # modeld holds it back while the first runs
            if "waiting for another pull of this blob" in line:
                break
        else:
            raise AssertionError("the second pull did not wait for the first")
        registry.resume.set()
        outputs = [p.communicate(timeout=30) for p in (first, second)]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert second is not None
    assert first.returncode == 0 and second.returncode == 0, outputs
    assert json.loads(outputs[0][0])["digest"] == model_file[1]
    assert outputs[1][0].startswith(f"pulled again:latest sha256:{model_file[1]}")
    assert len(registry.blob_gets()) == 1
    assert store.visible() == [f"blobs/sha256/{model_file[1]}", "by-name/again/latest.gguf",
                               "by-name/tiny/q8_0.gguf"]


def test_kill_9_of_modeld_during_a_pull_then_resume(
    tmp_path: Path, registry: LoopbackRegistry, model_file: tuple[Path, str]
) -> None:
    digest = model_file[1]
    registry.pause_after = 2_000_000
    pull = f'[hf]\nendpoint = "{registry.url}"\n'
    with modeld(tmp_path, pull=pull) as store:
        client = subprocess.Popen(
            [sys.executable, "-m", "syntrop.cli.syn", "pull", REF, "--retries", "0"],
            env=store.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert registry.paused.wait(20)
            wait_for(lambda: store.journal().get(digest, 0) > 0, 10,
                     "modeld never journaled the partial")
            os.kill(store.daemon.pid, signal.SIGKILL)
            _, stderr = client.communicate(timeout=30)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
        assert client.returncode == 1 and "Traceback" not in stderr, stderr
        assert "lost modeld during the pull" in stderr
    registry.resume.set()
    assert store.visible() == []  # nothing at a final path
    assert store.partials() == [digest]
    kept = store.journal()[digest]
    registry.pause_after = None
    with modeld(tmp_path, pull=pull) as store:
        assert store.syn_json("list") == []
        model = store.syn_json("pull", REF)
        assert model["digest"] == digest
        assert registry.blob_gets()[-1].range == f"bytes={kept}-"
        assert store.partials() == []
        blob = store.directory / "blobs" / "sha256" / digest
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest
        store.daemon.assert_healthy()


def test_a_progress_bar_on_a_terminal(store: Store, registry: LoopbackRegistry) -> None:
    registry.pause_after = 2_000_000
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "syntrop.cli.syn", "pull", REF], env=store.env(TERM="xterm"),
        stdin=child, stdout=child, stderr=child)
    os.close(child)
    output = b""
    try:
        assert registry.paused.wait(20)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            if select.select([main], [], [], 0.1)[0]:
                with contextlib.suppress(OSError):
                    output += os.read(main, 65536)
        registry.resume.set()
        process.wait(30)
        with contextlib.suppress(OSError):
            while select.select([main], [], [], 0.2)[0]:
                output += os.read(main, 65536)
    finally:
        os.close(main)
        if process.poll() is None:
            process.kill()
            process.wait()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace"))
    assert process.returncode == 0, text
    # rich's columns: bytes done/total, rate, time left
    assert re.search(r"receiving .* 2\.0/4\.0 MB [\d.]+ [kMG]?B/s \d+:\d\d:\d\d", text), text
    assert "pulled tiny:q8_0" in text


def test_list_show_rm_pin_unpin_prune_commands(store: Store, registry: LoopbackRegistry,
                                               tmp_path: Path) -> None:
    store.syn_json("pull", REF)
    other = tmp_path / "other.gguf"
    write_tiny(other, seed=3)
    store.syn_json("pull", str(other), "--name", "other:v1")
    table = store.syn("list")
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["NAME", "SIZE", "FORMAT", "ARCH", "QUANT"]
    assert [line.split()[0] for line in lines[1:] if line.strip()] == ["other:v1", "tiny:q8_0"]
    shown = store.syn("show", "tiny:q8_0").stdout
    assert "architecture: llama" in shown and "quantization: Q8_0" in shown
    assert store.syn_json("pin", "other:v1") == {"pinned": ["other:v1"]}
    assert one_line_error(store.syn("rm", "other:v1")) == (
        "syn: other:v1 is pinned: nothing removed (syn unpin it first, or syn rm --force)")
    result = store.syn_json("prune", "--budget", "0", "--dry-run")
    assert result["removed"] == ["tiny:q8_0"]
    assert store.syn("prune", "--budget", "1K").stdout.startswith("removed tiny:q8_0\nfreed ")
    assert store.syn_json("unpin", "other:v1") == {"unpinned": ["other:v1"]}
    assert store.syn("rm", "other:v1").stdout == "removed other:v1\n"
    assert store.syn_json("list") == []
    assert one_line_error(store.syn("rm", "other:v1")) == "syn: no model named other:v1"
    line = one_line_error(store.syn("show", "../etc"))
    assert line.startswith("syn: invalid model name '../etc'")
    # An ollama-style bare name: the configured default registry has no
    # smollm2 (a 404 naming the reference it became); with no registry
    # configured, a message saying how to configure or name one.
    line = one_line_error(store.syn("pull", "smollm2"))
    assert "ollama://library/smollm2:latest" in line and "404" in line
    empty = tmp_path / "empty-config"
    empty.mkdir()
    line = one_line_error(store.syn("pull", "smollm2:q4", CONFIGURATION_DIRECTORY=str(empty)))
    assert line == (
        "syn: smollm2:q4: no such file here, and no default registry for bare names is "
        f"configured. Set endpoint in [ollama] of {empty}/pull.toml (or "
        "$SYNTROP_OLLAMA_ENDPOINT) to pull it as ollama://library/smollm2:q4, or name the "
        "registry: syn pull ollama://REGISTRY/library/smollm2:q4, or hf://ORG/REPO/FILE.gguf")
    line = one_line_error(store.syn("pull", "ftp://x/y"))
    assert "unknown scheme ftp://" in line
    assert "invalid model name" in one_line_error(store.syn("pull", REF, "--name", "a/b"))


def test_syn_says_when_modeld_is_not_there(tmp_path: Path) -> None:
    env = {**os.environ, "RUNTIME_DIRECTORY": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "syntrop.cli.syn", "list"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"syn: cannot reach modeld at {tmp_path}/io.syntrop.Model1")
