"""The llama architecture's forward pass, in float64 numpy, written from the
architecture's definition as llama.cpp lays out the tensors."""

from collections.abc import Sequence

import numpy as np

from syntrop.runtimed.oracle.weights import Array, Config, OracleError, Weights


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    normed: Array = x * scale * weight
    return normed


def rope(x: Array, positions: Array, config: Config) -> Array:
    """Rotate each adjacent pair (2i, 2i+1) of the first n_rot dimensions of
    every head by position * base^(-2i/n_rot) (llama.cpp's rope type
    "normal", which llama-architecture files are converted for).
    x: (tokens, heads, head_dim)."""
    n_rot = config.n_rot
    inverse = config.rope_base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    angles = (positions * config.rope_scale)[:, None] * inverse[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    out = x.copy()
    even, odd = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = even * cos - odd * sin
    out[..., 1:n_rot:2] = even * sin + odd * cos
    return out


#: The activation type llama.cpp's CPU backend quantizes a matrix
#: product's input to, by weight type (ggml's vec_dot_type), and its block.
ACTIVATION_BLOCKS = {"Q4_0": ("Q8_0", 32), "Q4_1": ("Q8_1", 32), "Q5_0": ("Q8_0", 32),
                     "Q5_1": ("Q8_1", 32), "Q8_0": ("Q8_0", 32), "Q2_K": ("Q8_K", 256),
                     "Q3_K": ("Q8_K", 256), "Q4_K": ("Q8_K", 256), "Q5_K": ("Q8_K", 256),
                     "Q6_K": ("Q8_K", 256)}


def round_activations(x: Array, weight_type: str) -> Array:
    """x as llama.cpp's CPU kernels see it before a product with a matrix of
    `weight_type`: 8-bit blocks with a float16 (Q8_0, Q8_1) or float32 (Q8_K)
    scale, float16 for F16 matrices, unchanged otherwise."""
    if weight_type == "F16":
        return x.astype(np.float16).astype(np.float64)
    kind = ACTIVATION_BLOCKS.get(weight_type)
    if kind is None:
        return x
    name, block = kind
    blocks = x.reshape(x.shape[0], -1, block)
    amax = np.abs(blocks).max(axis=-1, keepdims=True).astype(np.float32)
    scale = amax / np.float32(127.0)
    inverse = np.divide(np.float32(1.0), scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.clip(np.rint(blocks.astype(np.float32) * inverse), -127, 127)
    if name != "Q8_K":  # the block keeps its scale as float16
        scale = scale.astype(np.float16)
    rounded: Array = (q.astype(np.float64) * scale.astype(np.float64)).reshape(x.shape)
    return rounded


def _linear(weights: Weights, name: str, x: Array) -> Array:
    if weights.emulate:
        x = round_activations(x, weights.type_of(name + ".weight"))
    y = x @ weights.get(name + ".weight").T
    if weights.has(name + ".bias"):
        y = y + weights.get(name + ".bias")
    return y


def expand_kv(x: Array, config: Config) -> Array:
    """Grouped-query attention: query head j reads KV head j // group
    (ggml's broadcast in its matrix product). x: (tokens, kv heads, dim)."""
    expanded: Array = np.repeat(x, config.n_head // config.n_head_kv, axis=1)
    return expanded


def attention(weights: Weights, layer: int, h: Array, positions: Array) -> Array:
    c = weights.config
    prefix = f"blk.{layer}."
    n = h.shape[0]
    q = _linear(weights, prefix + "attn_q", h).reshape(n, c.n_head, c.head_dim)
    k = _linear(weights, prefix + "attn_k", h).reshape(n, c.n_head_kv, c.head_dim)
    v = _linear(weights, prefix + "attn_v", h).reshape(n, c.n_head_kv, c.head_dim)
    q, k = rope(q, positions, c), rope(k, positions, c)
    if weights.emulate:  # the KV cache is float16, and so is the query then
        q, k, v = (a.astype(np.float16).astype(np.float64) for a in (q, k, v))
    k, v = expand_kv(k, c), expand_kv(v, c)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(c.head_dim)
    scores = scores + np.triu(np.full((n, n), -np.inf), k=1)[None]
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores = scores / scores.sum(axis=-1, keepdims=True)
    if weights.emulate:
        scores = scores.astype(np.float16).astype(np.float64)
    out = np.einsum("hqk,khd->qhd", scores, v).reshape(n, c.n_head * c.head_dim)
    return _linear(weights, prefix + "attn_output", out)


def feed_forward(weights: Weights, layer: int, h: Array) -> Array:
    prefix = f"blk.{layer}."
    gate = _linear(weights, prefix + "ffn_gate", h)
    up = _linear(weights, prefix + "ffn_up", h)
    silu = gate / (1.0 + np.exp(-gate))
    return _linear(weights, prefix + "ffn_down", silu * up)


def logits(weights: Weights, tokens: Sequence[int]) -> Array:
    """Logits (tokens, vocabulary) after every position of `tokens`."""
    c = weights.config
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= c.n_vocab:
        raise OracleError("token ids out of the vocabulary")
    x = weights.get("token_embd.weight", rows=ids)
    positions = np.arange(len(ids), dtype=np.float64)
    for layer in range(c.n_layer):
        prefix = f"blk.{layer}."
        h = rms_norm(x, weights.get(prefix + "attn_norm.weight"), c.eps)
        x = x + attention(weights, layer, h, positions)
        h = rms_norm(x, weights.get(prefix + "ffn_norm.weight"), c.eps)
        x = x + feed_forward(weights, layer, h)
    x = rms_norm(x, weights.get("output_norm.weight"), c.eps)
    output = "output.weight" if weights.has("output.weight") else "token_embd.weight"
    result: Array = x @ weights.get(output).T
    return result
