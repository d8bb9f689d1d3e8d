"""runtimed's idle exit waits for a resident model's keep-alive: the same
process answers past the idle timeout with the model still loaded, and
exits by itself once the keep-alive has unloaded it."""

import hashlib
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

from tests.models import smollm2
from tests.service.runtimed_node import Node, collect, greedy
from tests.support import activated

IDLE = 1.0
KEEP_ALIVE = 4.0


def test_resident_model_outlives_the_idle_timeout(tmp_path: Path) -> None:
    path = smollm2()
    root = tmp_path / "node"
    (root / "config").mkdir(parents=True)
    (root / "config" / "runtimed.toml").write_text(f"[runtimed]\nkeep_alive = {KEEP_ALIVE}\n")
    with ExitStack() as stack:
        stack.enter_context(activated("modeld", root))
        runtime = stack.enter_context(activated("runtimed", root, idle_timeout=IDLE))
        node = Node(root, runtime.address, runtime.process.pid)

        async def load() -> None:
            async with await node.modeld() as modeld:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                await modeld.Register(name="smollm2", path=str(path), sha256=digest)
            async with await node.runtimed() as client:
                text, _ = await collect(client.Complete(model="smollm2", prompt="1, 2, 3,",
                                                        sampling=greedy(4)))
                assert text

        async def loaded() -> list[str]:
            async with await node.runtimed() as client:
                return list((await client.GetLoad())["loaded_models"])

        node.run(load())
        time.sleep(IDLE * 2.5)
        assert runtime.process.poll() is None, "runtimed exited with a model resident"
        assert node.run(loaded()) == ["smollm2"]
        assert runtime.process.pid == node.pid
        # Past the keep-alive the model is unloaded, and runtimed exits on idle.
        try:
            assert runtime.process.wait(KEEP_ALIVE + IDLE * 2 + 10) == 0
        except subprocess.TimeoutExpired:
            raise AssertionError("runtimed still runs after its model's keep-alive") from None
