"""runtimed's service tests share these: a node (modeld and runtimed on one
root, SmolLM2 registered), and readers of what runtimed answers. Importing
this skips a module where llama_cpp cannot be imported."""

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from syntrop.interfaces.clients import Model1Client, Runtime1Client
from syntrop.interfaces.model import Model1
from syntrop.interfaces.runtime import ContextManifest, Runtime1, Sampling
from syntrop.varlink.client import connect
from tests.models import SMOLLM2_SHA256, require_llama, smollm2
from tests.support import activated

SHA256 = SMOLLM2_SHA256

require_llama()


class Node:
    """modeld and runtimed sharing one root."""

    def __init__(self, root: Path, runtime: str, pid: int = 0) -> None:
        self.root = root
        self.runtime = runtime
        #: runtimed's process (systemd-socket-activate execs it).
        self.pid = pid
        self.model = f"unix:{root / 'run' / Model1.name}"

    def run(self, main: Any) -> Any:
        return asyncio.run(main)

    async def runtimed(self) -> Runtime1Client:
        return await connect(Runtime1, address=self.runtime, timeout=60)

    async def modeld(self) -> Model1Client:
        return await connect(Model1, address=self.model, timeout=60)


def register(node: Node, files: dict[str, Path]) -> None:
    """Register `files` in the node's modeld by name, then start runtimed
    (socket activation starts it on its first connection: in the fixture,
    not inside a test)."""
    async def main() -> None:
        async with await node.modeld() as modeld:
            for name, path in files.items():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                await modeld.Register(name=name, path=str(path), sha256=digest)
        async with await node.runtimed() as runtime:
            await runtime.GetLoad()
    node.run(main())


@contextlib.contextmanager
def started(root: Path, config: str | None = None) -> Iterator[Node]:
    """modeld and runtimed under `root`, SmolLM2 registered; `config` is
    runtimed.toml's text."""
    path = smollm2()
    if config is not None:
        (root / "config").mkdir(parents=True, exist_ok=True)
        (root / "config" / "runtimed.toml").write_text(config)
    with ExitStack() as stack:
        stack.enter_context(activated("modeld", root))
        runtime = stack.enter_context(activated("runtimed", root))
        node = Node(root, runtime.address, runtime.process.pid)

        async def register() -> None:
            async with await node.modeld() as modeld:
                await modeld.Register(name="smollm2", path=str(path), sha256=SHA256)

        node.run(register())
        yield node


def chunk_of(reply: Any) -> Any:
    return reply["chunk"] if isinstance(reply, dict) else reply


async def collect(replies: AsyncIterator[Any]) -> tuple[str, str | None]:
    text, reason = "", None
    async for reply in replies:
        chunk = chunk_of(reply)
        text += chunk.text
        reason = chunk.finish_reason
    return text, reason


def greedy(max_tokens: int = 32, seed: int = 1, temperature: float = 0.0) -> Sampling:
    return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=None, top_k=None,
                    seed=seed, stop=None)


def manifest(**changes: str) -> ContextManifest:
    fields = {"profile": "test", "model": "smollm2", "model_digest": SHA256,
              "tokenizer_digest": "t", "template_digest": "x", "runtime_digest": "r",
              "bos": "add"}
    return ContextManifest(**{**fields, **changes})
