"""Sessions that stream past their context window over runtimed's real
socket: the tiny model with a 128-token window and 4 attention sinks
decodes four windows' worth in one Decode, shifting its KV cache, with
runtimed's memory flat; the sinks stay resident, the journal keeps the
latest text within its bound, and a model whose cache cannot shift (M-RoPE)
or a bad window is refused with a declared error."""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncvarlink import VarlinkErrorReply

from syntrop.interfaces.runtime import (
    Constraint,
    ContextReport,
    InvalidSampling,
    NoPrefix,
    Sampling,
    SessionConfig,
    ShiftUnsupported,
)
from tests import tinymodel
from tests.models import require_llama
from tests.service.runtimed_node import Node, chunk_of, manifest, register, started

require_llama()

N_CTX = 128
SINKS = 4
PREFIX = "the theorem of the rain"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    folder = tmp_path_factory.mktemp("sinks")
    files = {"tiny": tinymodel.write(folder / "tiny-endless.gguf", "F32", endless=True),
             "tiny-mrope": tinymodel.write(folder / "tiny-mrope.gguf", "F32",
                                           architecture="qwen2vl")}
    with started(folder / "node") as node:
        register(node, files)
        yield node


def config(sinks: int | None = SINKS, journal_bytes: int | None = 512,
           n_ctx: int = N_CTX) -> SessionConfig:
    return SessionConfig(n_ctx=n_ctx, n_batch=None, n_threads=1, n_gpu_layers=None,
                         flash_attn=None, kv_cache_type=None, prompt_format=None,
                         disable_bos=None, sinks=sinks, journal_bytes=journal_bytes)


def sampling(max_tokens: int, seed: int = 3) -> Sampling:
    # The endless tiny model's </s> is never among the 40 likeliest tokens.
    return Sampling(max_tokens=max_tokens, temperature=1.0, top_p=None, top_k=40, seed=seed,
                    stop=None, min_p=0.0)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_session_streams_four_windows_with_memory_flat(node: Node) -> None:
    async def main() -> tuple[list[Any], list[ContextReport], list[int]]:
        async with await node.runtimed() as runtime:
            opened = await runtime.OpenSession(owner_instance_id="sinks", model="tiny",
                                               config=config())
            sid = opened["session_id"]
            # The session's KV cache lives in its model's engine worker.
            engine = await runtime.GetEngine()
            pid = next(w.pid for w in engine["workers"] if w.model == "tiny")
            assert pid is not None
            reports, rss = [], [rss_kib(pid)]
            try:
                await runtime.EnsurePrefix(session_id=sid, text=PREFIX,
                                           manifest=manifest(model="tiny"))
                chunks = []
                # One window first (the cache fills), then three more.
                for tokens in (N_CTX, 3 * N_CTX):
                    async for reply in runtime.Decode(session_id=sid,
                                                      sampling=sampling(tokens)):
                        chunks.append(chunk_of(reply))
                    reports.append(await runtime.ExplainContext(session_id=sid))
                    rss.append(rss_kib(pid))
            finally:
                await runtime.Close(session_id=sid)
            return chunks, reports, rss

    chunks, reports, rss = node.run(main())
    lasts = [c for c in chunks if c.finish_reason is not None]
    assert [c.finish_reason for c in lasts] == ["length", "length"]
    generated = sum(c.tokens for c in chunks)
    assert generated == 4 * N_CTX
    # The second Decode ran three windows past a full one: it shifted.
    assert lasts[1].shifted_tokens and lasts[1].shifted_tokens >= 2 * N_CTX
    first, after = reports
    assert first["resident_tokens"] <= N_CTX
    assert after["shifted_tokens"] == first["shifted_tokens"] + lasts[1].shifted_tokens
    assert 0 < after["resident_tokens"] <= N_CTX
    # Only the sinks are left of the prefix.
    assert after["prefix_tokens"] == SINKS
    # The journal holds the latest text, within its bound, ending as the stream did.
    text = "".join(c.text for c in chunks)
    journal = after["journal"]
    assert 0 < len(journal.encode()) <= 512
    assert text.endswith(journal)
    assert after["journal_total_bytes"] == len(text.encode())
    # Memory: the first window's growth is the cache filling; streaming three
    # more windows does not grow it (allocator noise allowed).
    assert rss[2] - rss[1] < 4096, rss


def test_sinks_stay_and_the_stream_goes_on_after_a_shift(node: Node) -> None:
    """The same seed gives the same text after shifts (the shift is
    deterministic), and the first tokens (the sinks) are still what
    EnsurePrefix finds resident."""
    async def run() -> tuple[str, dict[str, Any]]:
        async with await node.runtimed() as runtime:
            opened = await runtime.OpenSession(owner_instance_id="sinks-again", model="tiny",
                                               config=config())
            sid = opened["session_id"]
            try:
                await runtime.EnsurePrefix(session_id=sid, text=PREFIX,
                                           manifest=manifest(model="tiny"))
                text = ""
                async for reply in runtime.Decode(session_id=sid,
                                                  sampling=sampling(2 * N_CTX, seed=9)):
                    text += chunk_of(reply).text
                # Part of the prefix is gone: a suffix cannot follow it.
                with pytest.raises(VarlinkErrorReply) as raised:
                    await runtime.PrefillSuffix(session_id=sid, text=" and more",
                                                manifest=manifest(model="tiny"))
                assert isinstance(raised.value, NoPrefix)
                # A constrained Decode on a full window: shifted first, then
                # decoded within what is left.
                constrained = ""
                async for reply in runtime.Decode(session_id=sid, sampling=sampling(8),
                                                  constraint=Constraint(regex="[a-z]{4}")):
                    constrained += chunk_of(reply).text
                assert re.fullmatch("[a-z]{4}", constrained)
                status = await runtime.EnsurePrefix(session_id=sid, text=PREFIX,
                                                    manifest=manifest(model="tiny"))
                suffix = await runtime.PrefillSuffix(session_id=sid, text=" and more",
                                                     manifest=manifest(model="tiny"))
            finally:
                await runtime.Close(session_id=sid)
            return text, {**status, "suffix_tokens": suffix["suffix_tokens"]}

    first_text, status = node.run(run())
    second_text, _ = node.run(run())
    assert first_text == second_text and len(first_text) > 0
    assert status["reused_tokens"] == SINKS
    assert status["prefix_tokens"] > SINKS and status["suffix_tokens"] > 0


def test_bad_windows_are_declared_errors(node: Node) -> None:
    async def main() -> list[VarlinkErrorReply | None]:
        errors: list[VarlinkErrorReply | None] = []
        async with await node.runtimed() as runtime:
            for model, cfg in (("tiny-mrope", config()), ("tiny", config(sinks=N_CTX)),
                               ("tiny", config(sinks=-1)), ("tiny", config(journal_bytes=0)),
                               ("tiny", config(sinks=None, journal_bytes=64))):
                try:
                    await runtime.OpenSession(owner_instance_id="bad-sinks", model=model,
                                              config=cfg)
                except VarlinkErrorReply as error:
                    errors.append(error)
                else:
                    errors.append(None)
            # Without sinks a Decode cannot ask for more than the window.
            opened = await runtime.OpenSession(owner_instance_id="bad-sinks", model="tiny",
                                               config=config(sinks=None, journal_bytes=None))
            sid = opened["session_id"]
            await runtime.EnsurePrefix(session_id=sid, text=PREFIX,
                                       manifest=manifest(model="tiny"))
            try:
                async for _ in runtime.Decode(session_id=sid, sampling=sampling(2 * N_CTX)):
                    pass
            except VarlinkErrorReply as error:
                errors.append(error)
            report = await runtime.ExplainContext(session_id=sid)
            assert report["journal"] is None and report["shifted_tokens"] is None
            await runtime.Close(session_id=sid)
            load = await runtime.GetLoad()
            assert load["free_slots"] == load["total_slots"]
        return errors

    errors = node.run(main())
    assert isinstance(errors[0], ShiftUnsupported)
    assert errors[0].parameters["model"] == "tiny-mrope"
    for error, parameter in zip(errors[1:5], ["config.sinks", "config.sinks",
                                               "config.journal_bytes", "config.journal_bytes"],
                                strict=True):
        assert error is not None and error.name == "org.varlink.service.InvalidParameter"
        assert error.parameters["parameter"] == parameter
    assert isinstance(errors[5], InvalidSampling)
    assert errors[5].parameters["parameter"] == "max_tokens"
