"""LoRA on the tiny model: an adapter the test writes changes the logits,
scale 0 gives exactly the base's, the scale moves them continuously, the
adapter comes off again, and an adapter for another base is refused before
llama.cpp loads it."""

from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from syntrop.runtimed.worker import batch as lowlevel
from syntrop.runtimed.worker import lora
from tests import tinymodel
from tests.models import require_llama

require_llama()
#: llama.cpp runs in this process: in a child pytest of its own (tests/isolation.py).
pytestmark = pytest.mark.isolated


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tinymodel.build(tmp_path_factory, "F32")


@pytest.fixture
def llama(base: Path) -> Iterator[Any]:
    from tests.models import Llama

    model = Llama(model_path=str(base), n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)
    yield model
    model.close()


def logits(llama: Any) -> Any:
    tokens = list(llama.tokenize(b"the adapter changes this", add_bos=True))
    batch = lowlevel.Batch(64)
    try:
        lowlevel.truncate(llama._ctx.ctx, 0, 0)
        row = lowlevel.prefill(llama._ctx.ctx, batch, tokens, 0)
        return lowlevel.logits(llama._ctx.ctx, row, llama._model.n_vocab()).copy()
    finally:
        batch.close()


def test_adapter_changes_the_logits_with_its_scale(llama: Any, base: Path,
                                                   tmp_path: Path) -> None:
    import numpy as np

    plain = logits(llama)
    adapter = lora.Adapter.load(llama, tinymodel.write_lora(tmp_path / "a.gguf"))
    adapter.attach(llama, 0.0)
    zero = logits(llama)
    adapter.attach(llama, 0.5)
    half = logits(llama)
    adapter.attach(llama, 1.0)
    full = logits(llama)
    lora.Adapter.detach(llama)
    again = logits(llama)
    assert np.array_equal(zero, plain)
    assert np.array_equal(again, plain)
    moved_half = float(np.abs(half - plain).max())
    moved_full = float(np.abs(full - plain).max())
    assert 0.01 < moved_half < moved_full


def test_generation_runs_with_the_adapter(llama: Any, base: Path, tmp_path: Path) -> None:
    adapter = lora.Adapter.load(llama, tinymodel.write_lora(tmp_path / "a.gguf"))
    prompt = list(llama.tokenize(b"hello", add_bos=True))
    plain = list(islice(llama.generate(prompt, temp=0.0), 12))
    adapter.attach(llama, 2.0)
    adapted = list(islice(llama.generate(prompt, temp=0.0, reset=True), 12))
    assert len(adapted) == 12
    assert adapted != plain


@pytest.mark.parametrize("options", [{"n_embd": 128}, {"architecture": "gemma3"},
                                     {"base_name": "another-model"}])
def test_adapter_for_another_base_is_refused_before_loading(
        llama: Any, base: Path, tmp_path: Path, options: dict[str, object]) -> None:
    path = tinymodel.write_lora(tmp_path / "x.gguf", **options)  # type: ignore[arg-type]
    with pytest.raises(lora.AdapterMismatch):
        lora.Adapter.load(llama, path)
    # The context is untouched and still generates.
    assert len(list(islice(llama.generate([1, 40, 41], temp=0.0), 3))) == 3
