"""Prefill hand-off inside a worker: a chat's prompt prefilled here and its
KV state handed out (`export`), and a state handed in put under a prompt
before it is answered (`adopt`).

A fleet node whose home for a long prompt is busy decoding asks an idle
node to prefill it (Runtime1.Prefill); the home answers with the state
restored (Runtime1.Chat's prefix_state) and evaluates only the prompt's
last token, for its logits. The state is the model's SHA-256 (64 hex
digits: a state of another file of the same name is not used), then
llama.cpp's sequence state in worker/saved.py's format; the prefill runs
CHUNK tokens per evaluation, the cancel and the pace board looked at
between chunks.

A state handed in is taken from a sealed memfd (saved.SEALS: nobody can
change it while it is read), or read from a pipe or socket to its end into
one of the worker's own (`take`: routerd copies a member's state in as it
comes, holding none of it), no larger than the model's context can hold
(`state_bytes`); the memfd is mapped, not copied; one that fails a check is
left unused and the prompt is prefilled. Its tokens are all that is checked
of it, so the context it went into stays its request's: the KV is dropped
when the request ends, and the pool neither reuses nor reports it
(`forget`).
"""

import fcntl
import logging
import os
import select
import stat
import threading
from collections.abc import Callable, Mapping, Sequence

from syntrop.prefix import reported
from syntrop.runtimed.layout import Pace
from syntrop.runtimed.protocol import Kind, Options, WorkerError
from syntrop.runtimed.sessions import common_prefix
from syntrop.runtimed.worker.engine import Engine, EngineError, LoadError, Overflow, Saved
from syntrop.runtimed.worker.pool import KEEP_MIN, Pool
from syntrop.runtimed.worker.saved import SEALS, map_saved, memfd_of

logger = logging.getLogger(__name__)

#: Bytes of the model's digest before the state.
DIGEST = 64
#: Bytes of one key or value element at most: f32, the widest KV type.
ELEMENT = 4
#: Bytes a sequence state takes per token besides its KV (its cell's
#: position and sequence ids), and in all (headers per layer), generously.
CELL = 64
OVERHEAD = 1 << 20
#: Prompt tokens evaluated per step of an exported prefill (the seed's
#: micro-batch): a cancel waits at most one chunk.
CHUNK = 1024
#: Bytes of a state handed in through a pipe read at a time, and the
#: seconds the sender may leave it waiting before it is refused.
READ_CHUNK = 1 << 20
READ_IDLE = 30.0


def export(pool: Pool, options: Options, turns: Sequence[tuple[str, str]], slots: int,
           stop: threading.Event, pace: Pace, digest: str) -> tuple[dict[str, int], list[int]]:
    """Prefill the chat `turns`' prompt but its last token in a context of
    the pool (reusing what one holds of it), in CHUNK-token steps; its
    state in a memfd, and how many tokens were reused and computed (no
    memfd when `stop` is set before the last chunk)."""
    try:
        tokens, _ = pool.tokenizer().chat_prompt(list(turns))
    except LoadError as error:
        raise WorkerError(Kind.INVALID_MODEL, model=pool.name, reason=error.reason) from None
    body = tokens[:-1]  # the last is evaluated where the answer is generated
    if not body:
        raise WorkerError(Kind.INVALID_PARAMETER, parameter="messages")
    engine = pool.take(options, tokens, room=slots, stop=stop)
    try:
        reused = start = min(common_prefix(engine.resident(), body), len(body))
        engine.prefill(start, [], pace)  # what follows the shared part goes
        while start < len(body):
            if stop.is_set():
                return {"tokens": 0, "reused_tokens": reused, "prefilled_tokens": 0,
                        "bytes": 0}, []
            step = body[start:start + CHUNK]
            engine.prefill(start, step, pace)
            start += len(step)
        saved = engine.save()
        if len(tokens) >= KEEP_MIN:
            engine.prefixes = reported(list(turns))
    except Overflow as error:
        raise WorkerError(Kind.OVERFLOW, tokens=error.tokens, n_ctx=error.n_ctx) from None
    finally:
        pool.give(options, engine)
    fd = memfd_of(saved, "syntrop-prefill", _header(digest), sealed=True)
    return {"tokens": len(saved.tokens), "reused_tokens": reused,
            "prefilled_tokens": len(body) - reused, "bytes": len(saved.data)}, [fd]


def _header(digest: str) -> bytes:
    return digest.encode("ascii", "replace")[:DIGEST].ljust(DIGEST, b"-")


def state_bytes(metadata: Mapping[str, str], n_ctx: int) -> int:
    """The most bytes a handed-in state of a context of `n_ctx` tokens of
    the model described by `metadata` (GGUF keys) can take: every layer's
    keys and values in f32 for every token, and CELL per token and
    OVERHEAD besides. A bound, not the size: KV heads default to the
    attention heads, head sizes to the embedding split among them."""
    arch = metadata.get("general.architecture", "")

    def number(key: str, default: int) -> int:
        try:
            return max(1, int(metadata.get(f"{arch}.{key}", default)))
        except ValueError:
            return default

    embedding = number("embedding_length", 1)
    heads = number("attention.head_count", 1)
    heads_kv = number("attention.head_count_kv", heads)
    size = (number("attention.key_length", max(1, embedding // heads)) +
            number("attention.value_length", max(1, embedding // heads)))
    per_token = number("block_count", 1) * heads_kv * size * ELEMENT + 4 + CELL
    return DIGEST + 8 + n_ctx * per_token + OVERHEAD


def handed(fds: list[int], digest: str, n_ctx: int,
           metadata: Callable[[], Mapping[str, str]]) -> Saved | None:
    """The state handed in with a request (fds[0], if any: a sealed memfd,
    or a pipe or socket read to its end into one here, `take`) when it is
    of the model of `digest` and passes `check` (`metadata()`: the model's,
    for the bound), every descriptor closed; None without one, or when it
    is of another model, fails a check or cannot be read."""
    taken: int | None = None
    try:
        if not fds:
            return None
        limit = state_bytes(metadata(), n_ctx)
        fd = fds[0]
        if stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode):
            fd = taken = take(fd, limit)
        check(fd, limit)
        if os.pread(fd, DIGEST, 0) != _header(digest):
            raise ValueError("a state of another model file")
        return map_saved(fd, DIGEST, n_ctx)
    except (OSError, ValueError, MemoryError) as error:
        logger.warning("a handed-in prefix state is not used: %s", error)
        return None
    finally:
        for fd in fds if taken is None else [*fds, taken]:
            os.close(fd)


def take(fd: int, limit: int, idle: float = READ_IDLE) -> int:
    """A new memfd, sealed with saved.SEALS, holding what the pipe or socket
    `fd` gives until its end, read READ_CHUNK bytes at a time (the state's
    sender holds none of it: routerd copies a member's state in as it
    comes); ValueError past `limit` bytes, or when nothing comes for `idle`
    seconds."""
    out = os.memfd_create("syntrop-handed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        waiting = select.poll()
        waiting.register(fd, select.POLLIN)
        size = 0
        while True:
            if not waiting.poll(int(idle * 1000)):
                raise ValueError(f"nothing of the state came for {idle:g} s")
            part = os.read(fd, min(READ_CHUNK, limit + 1 - size))
            if not part:
                break
            size += len(part)
            if size > limit:
                raise ValueError(f"more than a state of this context can take ({limit})")
            view = memoryview(part)
            while view:
                view = view[os.write(out, view):]
        fcntl.fcntl(out, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(out)
        raise
    return out


def check(fd: int, limit: int) -> None:
    """ValueError unless `fd` is a memfd sealed with saved.SEALS (a regular
    file is not: it could change while it is read) of at most `limit`
    bytes."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ValueError("not a regular file")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise ValueError("not a memfd") from None
    if seals & SEALS != SEALS:
        raise ValueError("a memfd not sealed against writes, shrinking and growth")
    size = os.fstat(fd).st_size  # fixed by the seals now
    if size > limit:
        raise ValueError(f"{size} bytes, more than a state of this context can take ({limit})")


def adopt(engine: Engine, saved: Saved | None, tokens: list[int]) -> int:
    """Put `saved` into `engine` for a prompt of `tokens` when it holds more
    of them than the engine does; the tokens it adds (0: not used). A state
    of other tokens, or one this context cannot take, changes nothing."""
    if saved is None:
        return 0
    count = len(saved.tokens)
    resident = common_prefix(engine.resident(), tokens)
    if count >= len(tokens) or tokens[:count] != saved.tokens or count <= resident:
        return 0
    engine.prefill(0, [])
    try:
        engine.restore(saved)
    except (EngineError, Overflow, MemoryError) as error:
        logger.warning("a handed-in prefix state is not used: %s", error)
        engine.prefill(0, [])
        return 0
    return count - resident


def forget(engine: Engine) -> None:
    """Drop the KV of a context a handed-in state went into, before it goes
    back to the pool: no other request is answered from it, and the pool
    reports no prefix of it."""
    engine.prefill(0, [])
    engine.prefixes = ()
