"""The oracle's pieces against independent references (no llama.cpp)."""

from pathlib import Path

import gguf
import numpy as np
import pytest

from syntrop.runtimed.oracle import forward
from syntrop.runtimed.oracle.compare import compare_logits
from syntrop.runtimed.oracle.weights import Config, OracleError, Weights
from tests import tinymodel

CONFIG = Config(n_layer=1, n_embd=8, n_head=2, n_head_kv=1, head_dim=4, n_rot=4,
                rope_base=10000.0, rope_scale=1.0, eps=1e-5, n_vocab=10)


def test_rope_is_a_rotation_of_adjacent_pairs() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 2, 4))
    positions = np.arange(5, dtype=np.float64)
    out = forward.rope(x, positions, CONFIG)
    # the same rotation as complex multiplication of (x0 + i x1) by e^(i p theta)
    pairs = x[..., 0::2] + 1j * x[..., 1::2]
    theta = 10000.0 ** (-np.arange(0, 4, 2) / 4)
    rotated = pairs * np.exp(1j * positions[:, None, None] * theta[None, None, :])
    assert np.allclose(out[..., 0::2], rotated.real) and np.allclose(out[..., 1::2], rotated.imag)
    assert np.allclose(forward.rope(x, np.zeros(5), CONFIG), x)  # position 0: unchanged


@pytest.mark.parametrize("qtype", ["Q8_0"])
def test_activation_rounding_is_ggml_q8_0(qtype: str) -> None:
    """The emulated rounding equals the gguf package's own Q8_0 round trip."""
    x = np.random.default_rng(1).normal(size=(3, 64)).astype(np.float32)
    kind = gguf.GGMLQuantizationType.Q8_0
    reference = gguf.quants.dequantize(gguf.quants.quantize(x, kind), kind)
    ours = forward.round_activations(x.astype(np.float64), qtype)
    assert np.allclose(ours, reference, atol=1e-6)
    assert not np.allclose(ours, x, atol=1e-6)  # it does round


def test_near_ties_are_not_counted() -> None:
    reference = np.array([[0.0, 5.0, 4.99, 1.0], [0.0, 5.0, 1.0, 1.0]])
    candidate = np.array([[0.0, 4.98, 5.0, 1.0], [0.0, 1.0, 5.0, 1.0]])
    first, second = compare_logits(reference, candidate, tie=0.05)
    assert first.agree is None  # 5.0 vs 4.99: closer than 0.05 of the spread
    assert second.agree is False and second.relative > 1.0


def test_forward_on_the_tiny_model_is_deterministic_and_causal(tmp_path: Path) -> None:
    path = tinymodel.write(tmp_path / "tiny.gguf", "F32")
    weights = Weights(path)
    assert weights.config.n_head_kv == tinymodel.N_HEAD_KV
    full = forward.logits(weights, [1, 40, 41, 42])
    prefix = forward.logits(weights, [1, 40])
    assert full.shape == (4, weights.config.n_vocab)
    assert np.allclose(full[:2], prefix)  # later tokens never change earlier logits
    with pytest.raises(OracleError):
        forward.logits(weights, [weights.config.n_vocab])


def test_other_architectures_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(OracleError, match="not llama"):
        Weights(path)
    (tmp_path / "junk.gguf").write_bytes(b"not a model at all")
    with pytest.raises(OracleError, match="GGUF"):
        Weights(tmp_path / "junk.gguf")
