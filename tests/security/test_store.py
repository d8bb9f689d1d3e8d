"""modeld's identifiers and what `syn pull` fetches: digests and names that
try to leave the store, pull URLs that name internal addresses, and a
compressed body that would inflate without bound."""

import hashlib
import ipaddress
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from syntrop.modeld import names
from syntrop.pull.fetch import fetch
from syntrop.pull.registries.base import Artifact
from tests.security.loopback import Answer, serving
from tests.unit.modeld.ggufs import write_tiny
from tests.unit.modeld.harness import Store, modeld

MODEL1 = "io.syntrop.Model1"

#: Digests that are not 64 hex digits of SHA-256.
BAD_DIGESTS = ["../" * 8 + "etc/passwd", "a" * 63 + "/", "a" * 32 + "\0" + "a" * 31,
               "sha512:" + "a" * 128, "md5:" + "a" * 32, "a" * 63, "a" * 65, "g" * 64,
               "sha256:" + "../" * 21 + "a", "/" + "a" * 63, "sha256:", ""]
#: Names that are not name[:tag], each a way out of the by-name tree.
BAD_NAMES = ["..", "../../etc/passwd", "/etc/passwd", "a/../../b", "a\0b", "..:latest",
             "a:../x", "a:/x", "\\..\\x", "a\u2028b", "x" * 129, "a:b:c"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with modeld(tmp_path_factory.mktemp("store")) as running_store:
        yield running_store
        running_store.daemon.assert_healthy()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    return path, write_tiny(path)


def _tree(root: Path) -> list[tuple[str, int]]:
    """Every path under `root` but the database, with its size."""
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else 0)
                  for p in root.rglob("*") if "modeld.db" not in p.name)


@pytest.mark.parametrize("text", BAD_DIGESTS)
def test_a_digest_that_is_not_sha256_hex_is_refused_by_the_parser(text: str) -> None:
    """Digest path traversal (a model server's digestToPath class): a digest
    becomes a file name under blobs/, so anything but 64 hex digits is
    InvalidDigest."""
    with pytest.raises(names.InvalidDigest):
        names.digest(text)


@pytest.mark.parametrize("text", BAD_NAMES)
def test_a_name_that_leaves_the_by_name_tree_is_refused_by_the_parser(text: str) -> None:
    """Name path traversal (same class: names become by-name/NAME/TAG)."""
    with pytest.raises(names.InvalidName):
        names.parse(text)


def test_varlink_methods_refuse_hostile_digests_and_names_touching_nothing(
    store: Store, model: tuple[Path, str]
) -> None:
    """Digest and name path traversal over Model1 (a model server's
    digestToPath class): Register with each bad sha256 is InvalidParameter;
    Show, Remove, Pin, OpenModel and Register with each bad name are
    InvalidIdentifier; neither the store nor the file next to it changes."""
    path, digest = model
    store.call("Register", name="keep", path=str(path), sha256=digest)
    outside = store.root / "state" / "outside"
    outside.write_bytes(b"not the store's")
    before = _tree(store.root / "state")
    for bad in BAD_DIGESTS:
        if bad == "":
            continue  # "" is how a client leaves sha256 out in some bindings
        error, params = store.error("Register", name="m", path=str(path), sha256=bad)
        assert (error, params) == ("org.varlink.service.InvalidParameter",
                                   {"parameter": "sha256"}), bad
    for bad in BAD_NAMES:
        for method in ("Show", "Remove", "Pin", "OpenModel", "Register"):
            extra: dict[str, Any] = {"path": str(path)} if method == "Register" else {}
            error, _ = store.error(method, name=bad, **extra)
            assert error == f"{MODEL1}.InvalidIdentifier", (method, bad)
    assert _tree(store.root / "state") == before
    assert outside.read_bytes() == b"not the store's"
    store.call("Remove", name="keep")


#: Addresses a pull must not reach: loopback, link-local, private, ULA.
INTERNAL = ["127.0.0.1", "127.1.2.3", "::1", "169.254.169.254", "10.0.0.1", "172.16.0.1",
            "172.31.255.255", "192.168.1.1", "fc00::1", "fd12:3456::1", "fe80::1",
            "::ffff:127.0.0.1", "::ffff:169.254.169.254"]
PUBLIC = ["8.8.8.8", "2606:4700::1", "172.32.0.1", "192.169.0.1"]


@pytest.mark.parametrize("address", INTERNAL)
def test_the_pull_address_rule_refuses_internal_addresses(address: str) -> None:
    """Pull SSRF to loopback/link-local/private addresses: the rule, as a
    pure function of an address (no traffic is sent)."""
    from syntrop.pull.addresses import refused

    assert refused(ipaddress.ip_address(address))
    for public in PUBLIC:
        assert not refused(ipaddress.ip_address(public))


def test_a_pull_naming_or_redirected_to_loopback_sends_nothing(
    store: Store, model: tuple[Path, str]
) -> None:
    """Pull SSRF to loopback (and a redirect to it): with the rule, `syn
    pull` refuses before a request leaves, so neither loopback server
    records one."""
    path, digest = model
    body = path.read_bytes()
    with serving(lambda _: (200, {}, body)) as target, \
            serving(lambda p: (302, {"location": target.url(p)}, b"")) as redirector:
        try:
            for url in (target.url("/m.gguf"), redirector.url("/m.gguf")):
                result = store.syn("pull", url, "--sha256", digest, "--name", "ssrf", timeout=30)
                assert result.returncode != 0, url
                assert "127.0.0.1: refused, not a global address" in result.stderr, result.stderr
                assert "pull.toml" in result.stderr, result.stderr
            assert redirector.requests == [] and target.requests == []
        finally:
            if any(m["name"] == "ssrf" for m in store.call("List")["models"]):
                store.call("Remove", name="ssrf")


def _bomb(inflated: int) -> bytes:
    """gzip of `inflated` zero bytes (about 1000:1)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join(packer.compress(block) for _ in range(inflated >> 20)) + packer.flush()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return _bomb(256 << 20)


def _gzip_served(body: bytes) -> "Any":
    def answer(_: str) -> Answer:
        return 200, {"content-encoding": "gzip", "content-type": "application/octet-stream"}, body
    return serving(answer)


def test_a_gzip_body_is_written_as_sent_never_inflated(bomb: bytes, tmp_path: Path) -> None:
    """Decompression bomb: nothing in a pull decompresses (fetch asks for
    identity and writes the raw body; registries are read as JSON only).
    A 256 MiB gzip bomb served with Content-Encoding: gzip from loopback
    arrives as its own compressed bytes."""
    out = tmp_path / "received"
    with _gzip_served(bomb) as server, httpx.Client(timeout=10) as client:
        artifact = Artifact(url=server.url("/bomb.gguf"), sha256=None, size=None,
                            filename="bomb.gguf")
        fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            written = fetch(client, artifact, 0, fd, what="bomb")
        finally:
            os.close(fd)
    assert written == len(bomb) < 1 << 20
    assert out.read_bytes() == bomb


def test_syn_pull_of_a_gzip_bomb_stores_nothing_and_answers(store: Store, bomb: bytes) -> None:
    """Decompression bomb through `syn pull` into modeld (its loopback
    server allowed): the compressed bytes are hashed as they are, are not a
    model, and are refused; nothing is kept."""
    digest = hashlib.sha256(bomb).hexdigest()
    with _gzip_served(bomb) as server:
        result = store.syn("pull", server.url("/bomb.gguf"), "--sha256", digest,
                           "--name", "bomb", timeout=30, SYNTROP_PULL_ALLOW="127.0.0.1/32")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "not a model file" in result.stderr, result.stderr
    assert store.partials() == []
    assert not any("bomb" in found for found in store.visible())
