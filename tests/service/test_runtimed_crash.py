"""runtimed survives its engine: each model runs in a worker process of its
own, and a worker that dies (here: kill -SEGV, as a native fault in
llama.cpp would) fails only the calls it was serving, with EngineCrashed,
within a second; the other model's stream goes on; the next request starts
a new worker; its sessions answer SessionLost; and a model that keeps
crashing is refused with EngineFailing instead of being restarted forever.

Over the real socket, with modeld, runtimed and SmolLM2 registered under
two names (so two workers)."""

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.interfaces.runtime import ChatMessage, EngineWorker
from tests.models import SMOLLM2_SHA256, require_llama, smollm2
from tests.service.runtimed_node import Node, chunk_of, greedy, manifest
from tests.support import activated

require_llama()

RUNTIME = "io.syntrop.Runtime1."


class Crashable(Node):
    """A node whose runtimed's log the test reads."""

    def __init__(self, root: Path, runtime: str, log: Path) -> None:
        super().__init__(root, runtime)
        self.log = log

    async def worker(self, model: str) -> EngineWorker:
        async with await self.runtimed() as runtime:
            engine = await runtime.GetEngine()
        worker: EngineWorker = next(w for w in engine["workers"] if w.model == model)
        return worker

    async def kill(self, model: str, signum: int = signal.SIGSEGV) -> int:
        """Signal `model`'s worker; its pid."""
        worker = await self.worker(model)
        assert worker.state == "running" and worker.pid is not None
        os.kill(worker.pid, signum)
        return worker.pid


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Crashable]:
    root = tmp_path / "node"
    (root / "config").mkdir(parents=True)
    (root / "config" / "runtimed.toml").write_text(
        "[runtimed]\ncrash_limit = 3\ncrash_window = 120\nkeep_alive = 60\n")
    log = tmp_path / "runtimed.log"
    with log.open("wb") as sink, activated("modeld", root), \
            activated("runtimed", root, stderr=sink.fileno()) as runtime:
        node = Crashable(root, runtime.address, log)

        async def register() -> None:
            async with await node.modeld() as modeld:
                for name in ("smollm2", "smollm2-b"):
                    await modeld.Register(name=name, path=str(smollm2()), sha256=SMOLLM2_SHA256)

        node.run(register())
        yield node


async def first_chunk(replies: Any) -> Any:
    return chunk_of(await replies.__anext__())


def test_a_worker_killed_mid_stream_fails_its_call_and_nothing_else(node: Crashable) -> None:
    async def main() -> dict[str, Any]:
        a, b = await node.runtimed(), await node.runtimed()
        try:
            doomed = a.Chat(model="smollm2", sampling=greedy(max_tokens=400, temperature=0.8),
                            messages=[ChatMessage(role="user", content="Tell me a long story.")])
            other = b.Complete(model="smollm2-b", prompt="Once upon a time",
                               sampling=greedy(max_tokens=120, temperature=0.8))
            await first_chunk(doomed)
            tokens = (await first_chunk(other)).tokens
            pid = await node.kill("smollm2")
            killed = time.monotonic()
            with pytest.raises(VarlinkErrorReply) as raised:
                async for _ in doomed:
                    pass
            failed_after = time.monotonic() - killed
            reason = None
            async for reply in other:  # the other model's stream goes on to its end
                chunk = chunk_of(reply)
                tokens += chunk.tokens
                reason = chunk.finish_reason
        finally:
            a.close()
            b.close()
        async with await node.runtimed() as runtime:
            text = ""
            async for reply in runtime.Complete(model="smollm2", prompt="The sky is",
                                                sampling=greedy(max_tokens=8)):
                text += chunk_of(reply).text
            load = await runtime.GetLoad()
        return {"error": raised.value, "failed_after": failed_after, "reason": reason,
                "tokens": tokens, "text": text, "pid": pid, "load": load,
                "worker": await node.worker("smollm2")}

    seen = node.run(main())
    error = seen["error"]
    assert error.name == RUNTIME + "EngineCrashed", error
    assert error.parameters["model"] == "smollm2" and error.parameters["signal"] == 11
    assert "SIGSEGV" in error.parameters["reason"]
    assert seen["failed_after"] < 1.0
    assert seen["reason"] == "length" and seen["tokens"] == 120
    assert seen["text"]  # a new worker answered
    worker = seen["worker"]
    assert worker.pid != seen["pid"] and worker.state == "running"
    assert worker.crashes == 1 and worker.last_signal == 11 and "Chat" in worker.last_calls
    load = seen["load"]
    assert load["free_slots"] == load["total_slots"]
    crashes = [line for line in node.log.read_text().splitlines()
               if "killed by signal" in line]
    assert len(crashes) == 1, crashes
    assert f"smollm2 (pid {seen['pid']})" in crashes[0] and "SIGSEGV" in crashes[0] \
        and "Chat" in crashes[0]


def test_sessions_of_a_dead_worker_are_lost_not_rebuilt(node: Crashable) -> None:
    async def main() -> tuple[Any, Any, Any, Any]:
        async with await node.runtimed() as runtime:
            opened = await runtime.OpenSession(owner_instance_id="crash", model="smollm2")
            sid = opened["session_id"]
            await runtime.EnsurePrefix(session_id=sid, text="You are terse.",
                                       manifest=manifest())
            await node.kill("smollm2", signal.SIGKILL)
            await asyncio.sleep(0.2)
            lost = []
            for call in (runtime.ExplainContext(session_id=sid),
                         runtime.EnsurePrefix(session_id=sid, text="You are terse.",
                                              manifest=manifest())):
                with pytest.raises(VarlinkErrorReply) as raised:
                    await call
                lost.append(raised.value)
            load = await runtime.GetLoad()
            await runtime.Close(session_id=sid)
            again = await runtime.OpenSession(owner_instance_id="crash", model="smollm2")
            await runtime.Close(session_id=again["session_id"])
            return lost, load, await runtime.GetLoad(), again

    lost, during, after, again = node.run(main())
    assert all(e.name == RUNTIME + "SessionLost" for e in lost), lost
    assert lost[0].parameters["model"] == "smollm2" and "SIGKILL" in lost[0].parameters["reason"]
    assert during["free_slots"] == during["total_slots"]  # its slot came back at once
    assert after["free_slots"] == after["total_slots"] and again["session_id"]


def test_a_model_that_keeps_crashing_is_refused(node: Crashable) -> None:
    async def crash_once() -> None:
        async with await node.runtimed() as runtime:
            async for _ in runtime.Complete(model="smollm2", prompt="Hi",
                                            sampling=greedy(max_tokens=2)):
                pass
        pid = await node.kill("smollm2")
        for _ in range(200):  # its death is seen at once; wait for the reap
            if (await node.worker("smollm2")).pid != pid:
                return
            await asyncio.sleep(0.01)

    async def main() -> tuple[Any, EngineWorker, Any]:
        for _ in range(3):
            await crash_once()
        async with await node.runtimed() as runtime:
            with pytest.raises(VarlinkErrorReply) as raised:
                async for _ in runtime.Complete(model="smollm2", prompt="Hi",
                                                sampling=greedy(max_tokens=2)):
                    pass
            # The other model, and runtimed, are unaffected.
            async for _ in runtime.Complete(model="smollm2-b", prompt="Hi",
                                            sampling=greedy(max_tokens=2)):
                pass
            load = await runtime.GetLoad()
        return raised.value, await node.worker("smollm2"), load

    error, worker, load = node.run(main())
    assert error.name == RUNTIME + "EngineFailing", error
    assert error.parameters["crashes"] == 3 and error.parameters["window_s"] == 120
    assert 0 < error.parameters["retry_after_s"] <= 120
    assert "SIGSEGV" in error.parameters["reason"]
    assert worker.state == "failing" and worker.pid is None and worker.crashes == 3
    assert load["loaded_models"] == ["smollm2-b"]


def test_close_waits_for_a_decode_in_flight(node: Crashable) -> None:
    """Close from another connection while the session decodes: the Decode
    finishes, then the context is closed; the worker never frees a context
    under a running call (that would be a use-after-free in llama.cpp)."""
    async def main() -> tuple[Any, Any, EngineWorker, EngineWorker, Any]:
        first, second = await node.runtimed(), await node.runtimed()
        try:
            opened = await first.OpenSession(owner_instance_id="close", model="smollm2")
            sid = opened["session_id"]
            await first.EnsurePrefix(session_id=sid, text="Count: 1, 2, 3,",
                                     manifest=manifest())
            before = await node.worker("smollm2")
            decoding = first.Decode(session_id=sid, sampling=greedy(max_tokens=120))
            await first_chunk(decoding)
            closing = asyncio.ensure_future(second.Close(session_id=sid))
            last = None
            async for reply in decoding:
                last = chunk_of(reply)
            await closing
            with pytest.raises(VarlinkErrorReply) as gone:
                await second.ExplainContext(session_id=sid)
            load = await second.GetLoad()
        finally:
            first.close()
            second.close()
        return last, gone.value, before, await node.worker("smollm2"), load

    last, gone, before, after, load = node.run(main())
    assert last.finish_reason == "length"
    assert gone.name == RUNTIME + "SessionNotFound"
    assert after.pid == before.pid and after.crashes == 0
    assert load["free_slots"] == load["total_slots"]


def test_a_caller_leaving_during_a_spill_leaves_the_spilled_session_whole(
        tmp_path: Path) -> None:
    """One slot held by an idle session; a completion needs it, so that
    session is spilled, and the completion's client goes away at once. The
    spill still completes on both sides: the session comes back warm and
    every slot is accounted for."""
    root = tmp_path / "node"
    (root / "config").mkdir(parents=True)
    (root / "config" / "runtimed.toml").write_text("[runtimed]\nslots = 1\nqueue = 4\n")
    prefix = "The quick brown fox jumps over the lazy dog by the river. " * 8
    with activated("modeld", root), activated("runtimed", root) as runtime:
        node = Crashable(root, runtime.address, tmp_path / "unused.log")

        async def main() -> tuple[Any, Any, Any]:
            async with await node.modeld() as modeld:
                await modeld.Register(name="smollm2", path=str(smollm2()), sha256=SMOLLM2_SHA256)
            async with await node.runtimed() as client:
                opened = await client.OpenSession(owner_instance_id="spill", model="smollm2")
                sid = opened["session_id"]
                cold = await client.EnsurePrefix(session_id=sid, text=prefix,
                                                 manifest=manifest())
                for delay in (0.0, 0.002, 0.01, 0.05):
                    leaving = await node.runtimed()
                    stream = leaving.Complete(model="smollm2", prompt="Hi",
                                              sampling=greedy(max_tokens=2))
                    task = asyncio.ensure_future(stream.__anext__())
                    await asyncio.sleep(delay)
                    task.cancel()
                    leaving.close()
                    with pytest.raises((asyncio.CancelledError, Exception)):
                        await task
                    warm = await client.EnsurePrefix(session_id=sid, text=prefix,
                                                     manifest=manifest())
                    assert warm["reused_tokens"] == cold["prefix_tokens"], delay
                await client.Close(session_id=sid)
                for _ in range(100):
                    load = await client.GetLoad()
                    if load["free_slots"] == 1:
                        break
                    await asyncio.sleep(0.05)
                return cold, warm, load

        cold, warm, load = node.run(main())
    assert warm["prefilled_tokens"] == 0 and cold["prefilled_tokens"] > 0
    assert load["free_slots"] == 1 and load["queue_depth"] == 0
