"""A llama-architecture GGUF file's hyperparameters and tensors, dequantized
by the gguf package (independent of llama.cpp's own kernels)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


class OracleError(Exception):
    """The file is not one the oracle can run: not GGUF, another
    architecture, a missing tensor or an unsupported feature."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """What the forward pass needs from the file's metadata."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_base: float
    rope_scale: float
    eps: float
    n_vocab: int


class Weights:
    """The tensors of one GGUF file, by GGUF name, as float64 matrices with
    llama.cpp's row layout (one row per output feature)."""

    def __init__(self, path: Path, *, emulate: bool = True) -> None:
        from gguf import GGUFReader

        #: Whether the forward pass rounds as llama.cpp's CPU backend does.
        self.emulate = emulate
        try:
            self._reader = GGUFReader(path)
        except (ValueError, OSError) as error:
            raise OracleError(f"cannot read {path} as GGUF: {error}") from None
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.config = self._config()

    def field(self, key: str, default: Any = None) -> Any:
        value = self._reader.fields.get(key)
        if value is None:
            if default is None:
                raise OracleError(f"the file has no {key}")
            return default
        return value.contents()

    def _config(self) -> Config:
        arch = self.field("general.architecture")
        if arch != "llama":
            raise OracleError(f"architecture {arch} is not llama")
        scaling = self.field("llama.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise OracleError(f"rope scaling {scaling} is not supported")
        factor = float(self.field("llama.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
        n_embd = int(self.field("llama.embedding_length"))
        n_head = int(self.field("llama.attention.head_count"))
        head_dim = int(self.field("llama.attention.key_length", n_embd // n_head))
        if int(self.field("llama.attention.value_length", head_dim)) != head_dim:
            raise OracleError("key and value heads of different sizes are not supported")
        if self.field("llama.expert_count", 0):
            raise OracleError("mixture-of-experts models are not supported")
        return Config(
            n_layer=int(self.field("llama.block_count")),
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=int(self.field("llama.attention.head_count_kv", n_head)),
            head_dim=head_dim,
            n_rot=int(self.field("llama.rope.dimension_count", head_dim)),
            rope_base=float(self.field("llama.rope.freq_base", 10000.0)),
            rope_scale=1.0 / factor,
            eps=float(self.field("llama.attention.layer_norm_rms_epsilon")),
            n_vocab=int(self._tensor("token_embd.weight").shape[1]),
        )

    def has(self, name: str) -> bool:
        return name in self._tensors

    def _tensor(self, name: str) -> Any:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise OracleError(f"the file has no tensor {name}")
        return tensor

    def type_of(self, name: str) -> str:
        return str(self._tensor(name).tensor_type.name)

    def types(self) -> dict[str, str]:
        """Tensor type name by tensor name."""
        return {name: t.tensor_type.name for name, t in self._tensors.items()}

    def get(self, name: str, rows: npt.NDArray[np.int64] | None = None) -> Array:
        """A tensor dequantized to float64: a vector, or a matrix (rows,
        columns) as GGUF stores it (its shape reversed); only `rows` when
        given (quantized blocks never span rows)."""
        from gguf.quants import dequantize

        tensor = self._tensor(name)
        data = tensor.data if rows is None else tensor.data[rows]
        try:
            values = dequantize(np.asarray(data), tensor.tensor_type)
        except NotImplementedError as error:
            raise OracleError(f"{name}: {error}") from None
        shape = [int(n) for n in reversed(tensor.shape.tolist())]
        if rows is not None:
            shape[0] = len(rows)
        return values.reshape(shape).astype(np.float64)
