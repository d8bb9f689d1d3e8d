"""LoRA adapters over runtimed's real socket: the tiny model and adapters the
test writes for it, registered in modeld; a session opened with an adapter
decodes differently, scale 0 decodes as the model alone, and an adapter for
another base is AdapterMismatch before any token."""

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.interfaces.model import Model1
from syntrop.interfaces.runtime import (
    AdapterMismatch,
    ModelNotFound,
    Runtime1,
    Sampling,
    SessionConfig,
)
from syntrop.varlink.client import connect
from tests import tinymodel
from tests.models import require_llama
from tests.service.runtimed_node import Node, collect, manifest, started

require_llama()

PREFIX = "abc def ghi"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    folder = tmp_path_factory.mktemp("lora")
    files = {
        "tiny": tinymodel.build(tmp_path_factory, "Q8_0"),
        "tiny-lora": tinymodel.write_lora(folder / "tiny-lora.gguf"),
        "wide-lora": tinymodel.write_lora(folder / "wide-lora.gguf", n_embd=2 * tinymodel.N_EMBD,
                                          base_name="another-model"),
    }
    with started(folder / "node") as node:
        async def register() -> None:
            async with await connect(Model1, address=node.model, timeout=60) as modeld:
                for name, path in files.items():
                    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                    await modeld.Register(name=name, path=str(path), sha256=digest)
            # runtimed starts on its first connection: here, not inside a test.
            async with await connect(Runtime1, address=node.runtime, timeout=60) as runtime:
                await runtime.GetLoad()
        node.run(register())
        yield node


def config(lora: str | None = None, scale: float | None = None) -> SessionConfig:
    return SessionConfig(n_ctx=256, n_batch=None, n_threads=1, n_gpu_layers=None,
                         flash_attn=None, kv_cache_type=None, prompt_format=None,
                         disable_bos=None, lora=lora, lora_scale=scale)


def decode(node: Node, session_config: SessionConfig) -> str:
    async def main() -> str:
        async with await node.runtimed() as runtime:
            opened = await runtime.OpenSession(owner_instance_id="lora-test", model="tiny",
                                               config=session_config)
            sid = opened["session_id"]
            try:
                await runtime.EnsurePrefix(session_id=sid, text=PREFIX,
                                           manifest=manifest(model="tiny"))
                text, _ = await collect(runtime.Decode(session_id=sid, sampling=Sampling(
                    max_tokens=16, temperature=0.0, top_p=None, top_k=None, seed=1,
                    stop=None)))
            finally:
                await runtime.Close(session_id=sid)
            return text
    result: str = node.run(main())
    return result


def test_an_adapter_changes_the_output_and_scale_zero_is_the_model_alone(node: Node) -> None:
    alone = decode(node, config())
    adapted = decode(node, config("tiny-lora", 1.0))
    assert adapted != alone
    assert decode(node, config("tiny-lora", 0.0)) == alone
    # The same adapter and scale give the same text again (greedy).
    assert decode(node, config("tiny-lora", 1.0)) == adapted


def refused(node: Node, session_config: SessionConfig) -> Any:
    async def main() -> None:
        async with await node.runtimed() as runtime:
            await runtime.OpenSession(owner_instance_id="lora-test", model="tiny",
                                      config=session_config)
    with pytest.raises(VarlinkErrorReply) as raised:
        node.run(main())
    return raised.value


def test_an_adapter_for_another_base_is_refused_and_nothing_leaks(node: Node) -> None:
    error = refused(node, config("wide-lora"))
    assert isinstance(error, AdapterMismatch)
    assert error.parameters["adapter"] == "wide-lora"
    # A model is not an adapter either.
    assert isinstance(refused(node, config("tiny")), AdapterMismatch)

    async def load() -> Any:
        async with await node.runtimed() as runtime:
            return await runtime.GetLoad()
    # Every slot came back, and the daemon serves on.
    before = node.run(load())
    assert before["free_slots"] == before["total_slots"]
    assert decode(node, config("tiny-lora"))


def test_unknown_adapters_and_bad_scales_are_declared_errors(node: Node) -> None:
    assert isinstance(refused(node, config("no-such-adapter")), ModelNotFound)
    error = refused(node, config("tiny-lora", 5.0))
    assert error.name == "org.varlink.service.InvalidParameter"
    assert error.parameters["parameter"] == "config.lora_scale"
