"""A tiny random-weight llama-architecture GGUF that llama.cpp loads.

Two layers, n_embd 256, four query heads over two KV heads (grouped-query
attention), an untied output matrix, and a SentencePiece-style vocabulary of
about 400 tokens: <unk>, <s>, </s>, the reasoning markers <think> and
</think> (user-defined tokens, as reasoning models ship them), the 256 byte
tokens <0x00>..<0xFF>, every printable ASCII character, and a few merges.
Weights are random (a fixed seed), so generation is noise, but every kind of
output is possible: that is what the constrained-decoding and reasoning
tests want, and the numpy oracle checks the arithmetic on it.

`write(path, qtype)` writes one file; `build(tmp_path_factory, qtype)`
writes it once per test session under the session's temporary directory.
Matrices are stored as `qtype` (F32, F16, Q8_0, Q4_0, Q4_1 or Q4_K); norms
stay F32, as llama.cpp's own converter leaves them.
"""

from pathlib import Path
from typing import Any

import pytest

N_EMBD = 256
N_FF = 512
N_HEAD = 4
N_HEAD_KV = 2
N_LAYER = 2
N_CTX = 512
ROPE_BASE = 10000.0
RMS_EPS = 1e-5
SEED = 1234

UNK, BOS, EOS, THINK, END_THINK = 0, 1, 2, 3, 4
FIRST_BYTE = 5
#: Multi-character pieces, so the tokenizer has merges to make ("▁" is the
#: SentencePiece space).
MERGES = ("▁t", "th", "he", "▁the", "in", "er", "an", "▁a", "on", "re", '{"', '":', '",',
          '"}', "▁{", "tr", "ue", "true", "al", "se", "false", "nu", "ll", "null")
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
QTYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (gguf.TokenType values)."""
    import gguf

    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>", "<think>", "</think>"]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL, tt.USER_DEFINED, tt.USER_DEFINED]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [tt.BYTE] * 256
    singles = ["▁"] + [chr(c) for c in range(0x21, 0x7F)]
    tokens += singles
    types += [tt.NORMAL] * len(singles)
    tokens += list(MERGES)
    types += [tt.NORMAL] * len(MERGES)
    # SentencePiece merges the pair whose result scores highest: longer
    # pieces score higher; specials and bytes never merge.
    scores = [0.0] * (FIRST_BYTE + 256) + [-100.0] * len(singles)
    scores += [float(len(piece)) - 10.0 for piece in MERGES]
    return tokens, scores, [int(t) for t in types]


def _q4_k(rows: Any) -> Any:
    """Quantize to Q4_K (the gguf package dequantizes it but cannot
    quantize it): per 256-value block an f16 scale and min, eight 6-bit
    sub-block scales and mins, 4-bit values."""
    import numpy as np

    blocks = rows.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(blocks.min(axis=2), 0.0)
    hi = blocks.max(axis=2)
    scale = np.maximum((hi - lo) / 15.0, 1e-8)
    mins = -lo
    d = np.maximum(scale.max(axis=1) / 63.0, 1e-8)
    dmin = np.maximum(mins.max(axis=1) / 63.0, 1e-8)
    sc = np.clip(np.rint(scale / d[:, None]), 1, 63).astype(np.uint8)
    mn = np.clip(np.rint(mins / dmin[:, None]), 0, 63).astype(np.uint8)
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    eff_scale = d16.astype(np.float32)[:, None] * sc
    eff_min = dmin16.astype(np.float32)[:, None] * mn
    q = np.clip(np.rint((blocks + eff_min[:, :, None]) / eff_scale[:, :, None]), 0, 15)
    q = q.astype(np.uint8)
    packed = np.zeros((blocks.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    out = np.concatenate([d16.view(np.uint8).reshape(-1, 2), dmin16.view(np.uint8).reshape(-1, 2),
                          packed, qs], axis=1)
    return out.reshape(rows.shape[0], -1)


def _store(writer: Any, name: str, data: Any, qtype: str) -> None:
    import gguf
    import numpy as np

    if qtype == "F32" or data.ndim == 1:
        writer.add_tensor(name, data.astype(np.float32))
    elif qtype == "F16":
        writer.add_tensor(name, data.astype(np.float16))
    elif qtype == "Q4_K":
        writer.add_tensor(name, _q4_k(data), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    else:
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(name, gguf.quants.quantize(data.astype(np.float32), kind),
                          raw_dtype=kind)


#: Architectures `write` can produce: llama, and qwen2vl (the same network
#: with q/k/v biases and multi-section rotary positions, M-RoPE, whose
#: KV cache llama.cpp cannot shift).
ARCHITECTURES = ("llama", "qwen2vl")


def write(path: Path, qtype: str = "F32", *, seed: int = SEED,
          architecture: str = "llama", endless: bool = False) -> Path:
    """Write the tiny model to `path` with matrices stored as `qtype`.
    `endless` zeroes the output row of </s>: its logit is then 0, near the
    median, so sampling with top-k 40 never ends a stream by itself."""
    import gguf
    import numpy as np

    if qtype not in QTYPES or architecture not in ARCHITECTURES:
        raise ValueError(f"unsupported type {qtype} or architecture {architecture}")
    tokens, scores, types = vocabulary()
    rng = np.random.default_rng(seed)
    head_dim = N_EMBD // N_HEAD
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"syntrop-tiny-{qtype}" + ("" if architecture == "llama" else
                                                f"-{architecture}"))
    writer.add_block_count(N_LAYER)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(ROPE_BASE)
    if architecture == "qwen2vl":
        # Temporal, height, width, extra: the rotary pairs of a head.
        writer.add_rope_dimension_sections([head_dim // 4, head_dim // 8, head_dim // 8, 0])
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(UNK)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def matrix(rows: int, cols: int, std: float) -> Any:
        return rng.normal(0.0, std, size=(rows, cols)).astype(np.float32)

    def norm(size: int) -> Any:
        return (1.0 + rng.normal(0.0, 0.1, size=size)).astype(np.float32)

    kv = head_dim * N_HEAD_KV
    _store(writer, "token_embd.weight", matrix(len(tokens), N_EMBD, 1.0), qtype)
    for layer in range(N_LAYER):
        prefix = f"blk.{layer}."
        _store(writer, prefix + "attn_norm.weight", norm(N_EMBD), qtype)
        _store(writer, prefix + "attn_q.weight", matrix(N_EMBD, N_EMBD, 0.08), qtype)
        _store(writer, prefix + "attn_k.weight", matrix(kv, N_EMBD, 0.08), qtype)
        _store(writer, prefix + "attn_v.weight", matrix(kv, N_EMBD, 0.08), qtype)
        if architecture == "qwen2vl":
            for name, size in (("attn_q", N_EMBD), ("attn_k", kv), ("attn_v", kv)):
                _store(writer, prefix + name + ".bias", norm(size) - 1.0, "F32")
        _store(writer, prefix + "attn_output.weight", matrix(N_EMBD, N_EMBD, 0.05), qtype)
        _store(writer, prefix + "ffn_norm.weight", norm(N_EMBD), qtype)
        _store(writer, prefix + "ffn_gate.weight", matrix(N_FF, N_EMBD, 0.08), qtype)
        _store(writer, prefix + "ffn_up.weight", matrix(N_FF, N_EMBD, 0.08), qtype)
        _store(writer, prefix + "ffn_down.weight", matrix(N_EMBD, N_FF, 0.05), qtype)
    _store(writer, "output_norm.weight", norm(N_EMBD), qtype)
    output = matrix(len(tokens), N_EMBD, 0.15)
    if endless:
        output[EOS] = 0.0
    _store(writer, "output.weight", output, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def build(factory: pytest.TempPathFactory, qtype: str = "F32") -> Path:
    """The tiny model as `qtype`, written once per test session."""
    folder = factory.getbasetemp() / "tinymodel"
    folder.mkdir(exist_ok=True)
    path = folder / f"tiny-{qtype}.gguf"
    if not path.exists():
        partial = path.with_suffix(".partial")
        write(partial, qtype)
        partial.rename(path)
    return path


def write_lora(path: Path, *, rank: int = 4, alpha: float = 8.0, seed: int = 7,
               architecture: str = "llama", n_embd: int = N_EMBD,
               targets: tuple[str, ...] = ("attn_q", "attn_v", "ffn_up"),
               base_name: str | None = "syntrop-tiny") -> Path:
    """A LoRA adapter for the tiny model (any of its quantizations): for each
    target matrix of every layer, lora_a (rank x its input size) and lora_b
    (its output size x rank), F32. `architecture`, `n_embd` and `base_name`
    let a test write one for another base."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = {"attn_q": (N_EMBD, N_EMBD), "attn_k": (N_EMBD, N_EMBD // N_HEAD * N_HEAD_KV),
             "attn_v": (N_EMBD, N_EMBD // N_HEAD * N_HEAD_KV), "attn_output": (N_EMBD, N_EMBD),
             "ffn_gate": (N_EMBD, N_FF), "ffn_up": (N_EMBD, N_FF), "ffn_down": (N_FF, N_EMBD)}
    scale = n_embd / N_EMBD
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    if base_name is not None:
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, base_name)
    for layer in range(N_LAYER):
        for target in targets:
            n_in, n_out = (int(d * scale) for d in sizes[target])
            name = f"blk.{layer}.{target}.weight"
            writer.add_tensor(name + ".lora_a",
                              rng.normal(0, 0.3, size=(rank, n_in)).astype(np.float32))
            writer.add_tensor(name + ".lora_b",
                              rng.normal(0, 0.3, size=(n_out, rank)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
