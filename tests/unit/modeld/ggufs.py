"""Tiny GGUF files written with the gguf package, for tests and benches."""

import hashlib
from pathlib import Path

import gguf
import numpy as np


def write_tiny(
    path: Path,
    *,
    architecture: str = "llama",
    file_type: int | None = int(gguf.LlamaFileType.MOSTLY_Q8_0),
    license: str | None = "apache-2.0",
    floats: int = 4096,
    seed: int = 0,
    tokens: int = 32,
) -> str:
    """A 2-layer llama-shaped GGUF with `floats` random F32 weights (4 bytes
    each) in one tensor. Returns its SHA-256."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    if file_type is not None:
        writer.add_file_type(file_type)
    if license is not None:
        writer.add_license(license)
    writer.add_name(f"tiny-{seed}")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(tokens)])
    writer.add_token_types([1] * tokens)
    writer.add_chat_template("{{ messages }}" * 500)  # a long string the reader skips
    rng = np.random.default_rng(seed)
    writer.add_tensor("token_embd.weight", rng.standard_normal(floats).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_bytes(tmp: Path, **options: object) -> bytes:
    path = tmp / f"tiny-{options.get('seed', 0)}-{options.get('floats', 4096)}.gguf"
    write_tiny(path, **options)  # type: ignore[arg-type]
    return path.read_bytes()
