"""LoRA adapter headers and the base check, on GGUF files the tests write
and the tiny model's metadata as llama.cpp reports it (no llama.cpp)."""

from pathlib import Path

import pytest

from syntrop.runtimed.worker import lora
from tests import tinymodel


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny model's metadata, read from its file (strings, as a
    `Llama`'s `metadata` has them)."""
    import gguf

    reader = gguf.GGUFReader(str(tinymodel.build(tmp_path_factory, "Q8_0")))
    return {key: str(field.contents()) for key, field in reader.fields.items()
            if not key.startswith(("tokenizer.", "GGUF."))}


def test_expected_shapes_follow_the_metadata(base: dict[str, str]) -> None:
    shapes = lora.expected_shapes(base)
    assert shapes["blk.1.attn_k.weight"] == (256, 128)
    assert shapes["blk.0.ffn_down.weight"] == (tinymodel.N_FF, tinymodel.N_EMBD)
    assert len(shapes) == 7 * tinymodel.N_LAYER


def test_read_an_adapter(tmp_path: Path) -> None:
    info = lora.read(tinymodel.write_lora(tmp_path / "a.gguf", rank=3, alpha=6.0))
    assert info.architecture == "llama" and info.alpha == 6.0 and info.rank == 3
    assert info.base_name == "syntrop-tiny"
    assert info.tensors["blk.1.ffn_up.weight"] == (tinymodel.N_EMBD, 3, tinymodel.N_FF)
    assert len(info.tensors) == 3 * tinymodel.N_LAYER


def test_a_matching_adapter_passes_the_check(tmp_path: Path, base: dict[str, str]) -> None:
    lora.check(lora.read(tinymodel.write_lora(tmp_path / "a.gguf")), base)
    lora.check(lora.read(tinymodel.write_lora(tmp_path / "b.gguf", base_name=None)), base)


@pytest.mark.parametrize(("options", "message"), [
    ({"architecture": "gemma3"}, "architecture gemma3"),
    ({"n_embd": 128}, "adapter is 128x128"),
    ({"base_name": "another-model"}, "base 'another-model'"),
])
def test_an_adapter_for_another_base_is_refused(tmp_path: Path, base: dict[str, str],
                                                options: dict[str, object],
                                                message: str) -> None:
    info = lora.read(tinymodel.write_lora(tmp_path / "x.gguf", **options))  # type: ignore[arg-type]
    with pytest.raises(lora.AdapterMismatch, match=message):
        lora.check(info, base)


def test_a_model_is_not_an_adapter(tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(lora.AdapterError, match="not a LoRA adapter"):
        lora.read(tinymodel.build(tmp_path_factory, "Q8_0"))


def test_an_adapter_for_a_missing_layer_is_refused(tmp_path: Path,
                                                   base: dict[str, str]) -> None:
    info = lora.read(tinymodel.write_lora(tmp_path / "a.gguf"))
    fewer = {**base, "llama.block_count": "1"}
    with pytest.raises(lora.AdapterMismatch, match=r"no tensor blk\.1"):
        lora.check(info, fewer)


def test_garbage_is_not_an_adapter(tmp_path: Path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(lora.AdapterError, match="not a GGUF file"):
        lora.read(path)
    path.write_bytes(b"not a gguf at all")
    with pytest.raises(lora.AdapterError):
        lora.read(path)
