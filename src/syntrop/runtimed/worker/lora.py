"""LoRA adapters, per context: checked against the base, then applied with
a scale.

`read` parses an adapter GGUF's header (general.type = adapter,
adapter.type = lora, adapter.lora.alpha, lora_a/lora_b tensor pairs);
`check` compares it with the base model's metadata (as llama.cpp parsed
it; re-reading the base file with gguf.GGUFReader takes seconds) before
llama.cpp sees it: the architecture, the presence and shape of every
adapted attention/feed-forward matrix (lora_a is rank x input, lora_b
output x rank, in ggml's order [input, rank] and [rank, output]; other
tensors are left to llama.cpp's own check at load, which refuses a bad
shape with an `AdapterError`), and the base model's identity where the adapter names one
(general.base_model.0.name, matched loosely against the model's
general.basename or the start of its general.name). A mismatch is an
`AdapterMismatch` before any token is generated.

`Adapter.load` loads the weights once per model (llama_adapter_lora_init);
`attach(llama, scale)` sets it on one context with a scale
(llama_set_adapters_lora), `detach` takes it off again, so one loaded model
can serve sessions with and without it (one context each).
"""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class AdapterError(Exception):
    """The file is not a LoRA adapter llama.cpp can use."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AdapterMismatch(AdapterError):
    """The adapter was made for another base model."""


@dataclass(frozen=True, slots=True)
class Info:
    """An adapter's header."""

    architecture: str
    alpha: float
    base_name: str | None
    #: Adapted tensor name -> (input size, rank, output size).
    tensors: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return max((r for _, r, _ in self.tensors.values()), default=0)


def _text(reader: Any, key: str) -> str | None:
    value = reader.get_field(key)
    if value is None:
        return None
    try:
        return str(value.contents())
    except (ValueError, TypeError, UnicodeDecodeError):
        return None


def read(path: Path) -> Info:
    """Parse `path`'s header; `AdapterError` when it is not a LoRA."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as error:
        raise AdapterError(f"not a GGUF file: {error}") from None
    if _text(reader, "general.type") != "adapter" or _text(reader, "adapter.type") != "lora":
        raise AdapterError("not a LoRA adapter (general.type adapter, adapter.type lora)")
    architecture = _text(reader, "general.architecture")
    alpha_field = reader.get_field("adapter.lora.alpha")
    if architecture is None or alpha_field is None:
        raise AdapterError("adapter without general.architecture or adapter.lora.alpha")
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    tensors: dict[str, tuple[int, int, int]] = {}
    for name, shape in shapes.items():
        if not name.endswith(".lora_a"):
            continue
        base = name.removesuffix(".lora_a")
        b = shapes.get(base + ".lora_b")
        if b is None or len(shape) != 2 or len(b) != 2 or shape[1] != b[0]:
            raise AdapterError(f"{base}: lora_a and lora_b do not pair up")
        tensors[base] = (shape[0], shape[1], b[1])
    if not tensors or any(n.endswith(".lora_b") and n[:-7] not in tensors for n in shapes):
        raise AdapterError("adapter without matching lora_a/lora_b tensor pairs")
    return Info(architecture=architecture, alpha=float(alpha_field.contents()),
                base_name=_text(reader, "general.base_model.0.name"), tensors=tensors)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def expected_shapes(metadata: dict[str, str]) -> dict[str, tuple[int, int]]:
    """(input, output) sizes of the per-layer matrices a LoRA usually adapts,
    from a model's own metadata (llama.cpp's names and keys)."""
    arch = metadata.get("general.architecture", "")

    def number(key: str, default: int = 0) -> int:
        try:
            return int(metadata.get(f"{arch}.{key}", default))
        except ValueError:
            return default

    n_embd, n_ff = number("embedding_length"), number("feed_forward_length")
    n_head = number("attention.head_count", 1) or 1
    n_head_kv = number("attention.head_count_kv", n_head) or n_head
    k_len = number("attention.key_length", n_embd // n_head)
    v_len = number("attention.value_length", k_len)
    per_layer = {"attn_q": (n_embd, n_head * k_len), "attn_k": (n_embd, n_head_kv * k_len),
                 "attn_v": (n_embd, n_head_kv * v_len), "attn_output": (n_head * v_len, n_embd),
                 "ffn_gate": (n_embd, n_ff), "ffn_up": (n_embd, n_ff), "ffn_down": (n_ff, n_embd)}
    return {f"blk.{layer}.{name}.weight": shape for layer in range(number("block_count"))
            for name, shape in per_layer.items()}


def check(info: Info, metadata: dict[str, str]) -> None:
    """`AdapterMismatch` unless `info` fits the model whose GGUF metadata is
    `metadata` (a `Llama`'s `metadata`). Tensors outside `expected_shapes`
    are left to llama.cpp's own check when the adapter loads."""
    architecture = metadata.get("general.architecture")
    if architecture != info.architecture:
        raise AdapterMismatch(f"adapter for architecture {info.architecture}, "
                              f"the model is {architecture}")
    if info.base_name is not None:
        wanted = _norm(info.base_name)
        basename, name = metadata.get("general.basename"), metadata.get("general.name")
        known = [n for n in (basename, name) if n]
        if known and not (basename and _norm(basename) == wanted) \
                and not (name and _norm(name).startswith(wanted)):
            raise AdapterMismatch(f"adapter for base {info.base_name!r}, "
                                  f"the model is {known[-1]!r}")
    shapes = expected_shapes(metadata)
    for name, (n_in, _, n_out) in sorted(info.tensors.items()):
        layer = name.split(".")
        if layer[0] == "blk" and name not in shapes and \
                layer[2] in {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                             "ffn_up", "ffn_down"}:
            raise AdapterMismatch(f"the model has no tensor {name}")
        shape = shapes.get(name)
        if shape is not None and shape != (n_in, n_out):
            raise AdapterMismatch(f"{name}: adapter is {n_in}x{n_out}, "
                                  f"the model's is {shape[0]}x{shape[1]}")


class Adapter:
    """A checked adapter loaded for one model (a `Llama`)."""

    def __init__(self, handle: Any, info: Info) -> None:
        self._handle = handle
        self.info = info

    @classmethod
    def load(cls, llama: Any, path: Path) -> "Adapter":
        """Check `path` against the model's metadata, then load it."""
        import llama_cpp

        info = read(path)
        check(info, dict(llama.metadata))
        handle = llama_cpp.llama_adapter_lora_init(llama._model.model, str(path).encode())
        if not handle:
            raise AdapterError("llama.cpp refused the adapter")
        return cls(handle, info)

    def attach(self, llama: Any, scale: float = 1.0) -> None:
        """Apply to `llama`'s context from its next evaluation on; resident
        tokens were computed without it, so the caller re-evaluates them."""
        import ctypes

        import llama_cpp

        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._handle)
        scales = (ctypes.c_float * 1)(scale)
        if llama_cpp.llama_set_adapters_lora(llama._ctx.ctx, adapters, 1, scales) != 0:
            raise AdapterError("llama.cpp could not set the adapter on the context")
        _forget(llama)

    @staticmethod
    def detach(llama: Any) -> None:
        import llama_cpp

        llama_cpp.llama_set_adapters_lora(llama._ctx.ctx, None, 0, None)
        _forget(llama)

    def close(self) -> None:
        """Free the weights (after every context using them is detached or
        closed; the model frees them too when it closes)."""
        import llama_cpp

        if self._handle is not None:
            llama_cpp.llama_adapter_lora_free(self._handle)
            self._handle = None


def _forget(llama: Any) -> None:
    """Drop the resident KV: it was computed with other weights."""
    llama._ctx.kv_cache_clear()
    llama.n_tokens = 0
