"""Resolving references and fetching bytes, against real loopback servers."""

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from syntrop.modeld import refs
from syntrop.pull.fetch import RangeIgnored, fetch
from syntrop.pull.registries import Artifact, RegistryError, Settings, registry_for
from syntrop.pull.registries.hf import etag_sha256
from tests.unit.modeld.registry import LoopbackRegistry, serving

DATA = os.urandom(300_000)
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LoopbackRegistry]:
    with serving(tmp_path / "srv") as server:
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client


def resolve(text: str, settings: Settings, http: httpx.Client) -> Artifact:
    ref = refs.parse(text)
    return registry_for(ref, settings, http).resolve(ref)


def collect(http: httpx.Client, artifact: Artifact, offset: int = 0) -> bytes:
    read, write = os.pipe()
    import threading

    chunks: list[bytes] = []

    def drain() -> None:
        while data := os.read(read, 1 << 16):
            chunks.append(data)

    thread = threading.Thread(target=drain)
    thread.start()
    try:
        fetch(http, artifact, offset, write, what="test")
    finally:
        os.close(write)
        thread.join()
        os.close(read)
    return b"".join(chunks)


def test_hf_resolve_reads_the_linked_etag_and_size(registry: LoopbackRegistry,
                                                   http: httpx.Client) -> None:
    registry.add_hf("org/Repo-GGUF", "sub/m.gguf", DATA)
    artifact = resolve("hf://org/Repo-GGUF/sub/m.gguf", Settings(hf_endpoint=registry.url), http)
    assert (artifact.sha256, artifact.size, artifact.filename) == (SHA, len(DATA), "m.gguf")
    assert collect(http, artifact) == DATA
    assert collect(http, artifact, 1000) == DATA[1000:]
    assert registry.blob_gets()[-1].range == "bytes=1000-"


def test_hf_errors_are_one_line_with_the_status(registry: LoopbackRegistry,
                                                http: httpx.Client) -> None:
    settings = Settings(hf_endpoint=registry.url)
    with pytest.raises(RegistryError, match="not found") as caught:
        resolve("hf://org/none/m.gguf", settings, http)
    assert caught.value.status == 404 and not caught.value.retryable
    registry.add_hf("org/gated", "m.gguf", DATA)
    registry.token = "secret"
    with pytest.raises(RegistryError, match=r"not authorized.*HF_TOKEN") as caught:
        resolve("hf://org/gated/m.gguf", settings, http)
    assert caught.value.status == 401
    authorized = Settings(hf_endpoint=registry.url, hf_token="secret")
    assert resolve("hf://org/gated/m.gguf", authorized, http).sha256 == SHA
    registry.fail["/org/gated"] = 500
    with pytest.raises(RegistryError, match="server error") as caught:
        resolve("hf://org/gated/m.gguf", authorized, http)
    assert caught.value.retryable


def test_hf_needs_an_endpoint(http: httpx.Client) -> None:
    with pytest.raises(RegistryError, match="HF_ENDPOINT"):
        resolve("hf://o/r/m.gguf", Settings(), http)


def test_etag_parsing() -> None:
    assert etag_sha256(f'"{SHA}"') == SHA
    assert etag_sha256(f'W/"{SHA.upper()}"') == SHA
    assert etag_sha256('"0a1b2c"') is None  # a git SHA-1 verifies nothing here
    assert etag_sha256(None) is None


def test_ollama_manifest_and_blob(registry: LoopbackRegistry, http: httpx.Client) -> None:
    registry.add_ollama("library", "tiny", "q8", DATA)
    configured = resolve("ollama://tiny:q8", Settings(ollama_endpoint=registry.url), http)
    named = resolve(f"ollama://{registry.host}/library/tiny:q8", Settings(insecure=True), http)
    assert configured.sha256 == named.sha256 == SHA
    assert configured.size == len(DATA)
    assert collect(http, named) == DATA
    with pytest.raises(RegistryError, match="not found"):
        resolve("ollama://tiny:nope", Settings(ollama_endpoint=registry.url), http)


@pytest.mark.parametrize("manifest, message", [
    (b"not json", "not JSON"),
    (b"{}", "no layers"),
    (b'{"layers": [{"mediaType": "application/vnd.ollama.image.license"}]}', "no model layer"),
    (b'{"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "md5:x",'
     b' "size": 1}]}', "no sha256"),
    (b'{"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:zz",'
     b' "size": 1}]}', "malformed"),
    (b'{"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:'
     + SHA.encode() + b'", "size": -1}]}', "no size"),
])
def test_bad_manifests(registry: LoopbackRegistry, http: httpx.Client, manifest: bytes,
                       message: str) -> None:
    registry.manifests["/v2/library/bad/manifests/latest"] = manifest
    with pytest.raises(RegistryError, match=message):
        resolve("ollama://bad", Settings(ollama_endpoint=registry.url), http)


def test_plain_url_and_faults(registry: LoopbackRegistry, http: httpx.Client) -> None:
    registry.add_file("m.gguf", DATA)
    artifact = resolve(f"{registry.url}/files/m.gguf", Settings(), http)
    assert (artifact.sha256, artifact.size) == (None, len(DATA))
    registry.cut_after, registry.cuts = 1000, 1
    with pytest.raises(RegistryError) as caught:
        collect(http, artifact)
    assert caught.value.retryable and caught.value.status == 0
    registry.ranges = False
    with pytest.raises(RangeIgnored):
        collect(http, artifact, 1000)
    with pytest.raises(RegistryError, match="not found"):
        resolve(f"{registry.url}/files/none.gguf", Settings(), http)


def test_settings_from_file_and_environment(tmp_path: Path) -> None:
    (tmp_path / "pull.toml").write_text(
        '[hf]\nendpoint = "http://file"\n[ollama]\nendpoint = "http://o"\n'
        "[transfer]\nretries = 1\ntimeout = 5\n")
    settings = Settings.load(tmp_path, {"HF_ENDPOINT": "http://env", "HF_TOKEN": "t"})
    assert (settings.hf_endpoint, settings.hf_token, settings.ollama_endpoint) == (
        "http://env", "t", "http://o")
    assert (settings.retries, settings.timeout) == (1, 5.0)
    assert Settings.load(tmp_path, {}, retries=0).retries == 0
    (tmp_path / "pull.toml").write_text("[transfer]\nretries = -1\n")
    from syntrop.config import ConfigError

    with pytest.raises(ConfigError, match="retries"):
        Settings.load(tmp_path, {})


def test_a_refused_tls_certificate_is_not_retried(tmp_path: Path) -> None:
    """A real handshake with a loopback HTTPS server whose certificate no
    trusted CA signed: the error is named, and not retried as transient."""
    import http.server
    import shutil
    import ssl
    import subprocess
    import threading

    from syntrop.pull.registries.base import transport_error

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem"), "-subj", "/CN=127.0.0.1", "-days", "1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        with pytest.raises(httpx.TransportError) as caught:
            httpx.get(f"https://127.0.0.1:{server.server_port}/model.gguf", timeout=10)
        error = transport_error(caught.value, "https://127.0.0.1/model.gguf")
        assert not error.retryable
        assert "TLS certificate was refused" in str(error)
        plain = transport_error(httpx.ConnectError("connection refused"), "x")
        assert plain.retryable
    finally:
        thread.join(5)
        server.server_close()
