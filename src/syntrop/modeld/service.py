"""The Varlink face of modeld: io.syntrop.Model1.

Each method checks its identifiers first (InvalidIdentifier before anything
is touched), calls the domain (staging, blobs, store, prune), maps the
domain's exceptions to the declared errors, and answers once the manifests
are committed.

Concurrency: `self.lock` serialises every change to names and to the blob
tree (short: links, renames, one SQLite transaction). Hashing and copying run
in threads outside it. Pulls of one digest are serialised by a lock per
digest: the second waits (phase "waiting"), then finds the blob stored and
only binds its name, so two pulls of one model store one blob and both
succeed.
"""

import asyncio
import errno
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TypeVar

from asyncvarlink import AnnotatedResult, FileDescriptor

from syntrop import modelfile as metadata
from syntrop.config import Paths
from syntrop.interfaces.model import (
    DigestMismatch,
    InvalidIdentifier,
    InvalidModel,
    InvalidReference,
    Model,
    Model1,
    ModelInUse,
    ModelNotFound,
    NotAuthorized,
    OpenModelResult,
    PruneResult,
    PullFailed,
    PullProgress,
    PullReply,
    StoreFull,
)
from syntrop.modeld import names, prune, refs, staging
from syntrop.modeld.blobs import BlobTree
from syntrop.modeld.config import Config, load
from syntrop.modeld.store import Blob, Entry, Manifests, Partial
from syntrop.system import files
from syntrop.varlink import InvalidParameter, authz, implements

logger = logging.getLogger(__name__)

#: Seconds between progress replies of a pull.
REPORT_INTERVAL = 0.25
#: Seconds between "waiting" replies while another pull of the blob runs.
WAIT_REPORT = 5.0
MAX_SIZE = 1 << 50
MAX_PATH = 4096
ROUTER_TIMEOUT = 5.0

T = TypeVar("T")


def _usec() -> int:
    return time.time_ns() // 1000


def _progress(phase: str, done: int, total: int | None, digest: str,
              model: Model | None = None) -> AnnotatedResult:
    """A reply of Pull, sent at once. (A plain yielded value would be held
    back by asyncvarlink until the next one exists, to know whether it is the
    last; the first reply tells the client to start sending, so it cannot
    wait.)"""
    reply: PullReply = {
        "progress": PullProgress(phase=phase, completed_bytes=done, total_bytes=total,
                                 digest=digest),
        "model": model,
    }
    return AnnotatedResult(dict(reply), continues=model is None)


class ModelService(Model1):
    """The content-addressed model store."""

    def __init__(self, paths: Paths, config: Config | None = None) -> None:
        self.paths = paths
        self.config = config or load(paths)
        self.tree = BlobTree(self.config.directory)
        self.manifests = Manifests(self.config.directory / "modeld.db")
        self.blobs, self.entries = self.manifests.load()
        self._recover()
        self.lock = asyncio.Lock()
        #: digest -> (lock, how many pulls hold or wait for it)
        self.digest_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def _recover(self) -> None:
        """After a start: drop rows whose blob is gone, blobs no row knows and
        blobs no name uses (unless open), journal rows without their partial;
        rebuild the by-name tree."""
        missing = {d for d in self.blobs if not self.tree.exists(d)}
        for digest in sorted(missing):
            logger.warning("blob %s is missing from the store, forgetting its names", digest)
        used = {e.digest for e in self.entries.values()}
        unused = {d for d in self.blobs if d not in used and not self.tree.in_use(d)}
        gone = missing | unused
        keys = [k for k, e in self.entries.items() if e.digest in gone]
        stale = [d for d in self.manifests.partial_digests() if not self.tree.partial(d).exists()]
        if keys or gone or stale:
            self.manifests.forget_sync(keys, gone, stale)
        for key in keys:
            del self.entries[key]
        for digest in gone:
            del self.blobs[digest]
        self.tree.sweep(
            set(self.blobs),
            {k: (self.blobs[e.digest].format, e.digest) for k, e in self.entries.items()},
        )

    def keep_alive(self) -> bool:
        return bool(self.tasks)

    async def aclose(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.manifests.close()

    # helpers ------------------------------------------------------------------

    @staticmethod
    def _name(text: str) -> names.ModelName:
        try:
            return names.parse(text)
        except names.InvalidName as error:
            raise InvalidIdentifier(identifier=error.identifier) from None

    @staticmethod
    def _digest(text: str | None, parameter: str = "sha256") -> str | None:
        if text is None:
            return None
        try:
            return names.digest(text)
        except names.InvalidDigest:
            raise InvalidParameter(parameter=parameter) from None

    def _entry(self, text: str) -> Entry:
        parsed = self._name(text)
        entry = self.entries.get((parsed.name, parsed.tag))
        if entry is None:
            raise ModelNotFound(name=str(parsed))
        return entry

    def _model(self, entry: Entry) -> Model:
        blob = self.blobs[entry.digest]
        return Model(
            name=entry.name, tag=entry.tag, digest=entry.digest, size=blob.size,
            format=blob.format, architecture=blob.architecture,
            quantization=blob.quantization, license=blob.license, pinned=entry.pinned,
            last_access_usec=entry.last_access_usec, source=entry.source,
        )

    def _check_space(self, needed: int) -> None:
        available = files.free_bytes(self.config.directory) - self.config.min_free_bytes
        if needed > available:
            raise StoreFull(required=needed, available=max(0, available))

    async def _thread(self, function: Callable[..., T], *args: object) -> T:
        """Blocking work off the event loop; ENOSPC becomes StoreFull."""
        try:
            return await asyncio.to_thread(function, *args)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull(required=0, available=0) from None
            raise

    @staticmethod
    def _blob(digest: str, size: int, info: metadata.ModelInfo) -> Blob:
        return Blob(digest=digest, size=size, format=info.format,
                    architecture=info.architecture, quantization=info.quantization,
                    license=info.license, added_usec=_usec())

    async def _bind(self, parsed: names.ModelName, blob: Blob, *, source: str | None,
                    pin: bool | None) -> Model:
        """Point name:tag at a stored blob (call with self.lock held)."""
        key = (parsed.name, parsed.tag)
        old = self.entries.get(key)
        if pin is None:
            pin = parsed.pinned or (old.pinned if old else False)
        entry = Entry(name=parsed.name, tag=parsed.tag, digest=blob.digest, pinned=pin,
                      last_access_usec=_usec(), source=source)
        await self.manifests.put(entry, None if blob.digest in self.blobs else blob)
        self.blobs.setdefault(blob.digest, blob)
        self.entries[key] = entry
        if old is not None and self.blobs[old.digest].format != blob.format:
            await asyncio.to_thread(self.tree.unlink_name, old.name, old.tag,
                                    self.blobs[old.digest].format)
        await asyncio.to_thread(self.tree.link_name, entry.name, entry.tag, blob.format,
                                blob.digest)
        if old is not None and old.digest != blob.digest:
            await self._collect([old.digest])
        return self._model(entry)

    async def _collect(self, digests: list[str]) -> None:
        """Delete blobs no name uses and nobody holds open (self.lock held)."""
        used = {e.digest for e in self.entries.values()}
        doomed = [d for d in digests if d not in used and d in self.blobs
                  and not self.tree.in_use(d)]
        if not doomed:
            return
        await self.manifests.remove(digests=doomed)
        for digest in doomed:
            del self.blobs[digest]
            await asyncio.to_thread(self.tree.delete, digest)

    def _reload_router(self) -> None:
        task = asyncio.get_running_loop().create_task(self._notify_router())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _notify_router(self) -> None:
        """Router1.Reload, so routerd sees the new model; not fatal."""
        from syntrop.interfaces.router import Router1
        from syntrop.varlink.client import connect

        try:
            async with await connect(Router1, timeout=ROUTER_TIMEOUT) as router:
                await router.Reload()
        except Exception as error:
            logger.info("routerd was not told to reload (%s: %s), ignoring",
                        type(error).__name__, error)
        else:
            logger.debug("routerd reloaded")

    # listing --------------------------------------------------------------------

    @implements
    def List(self) -> list[Model]:
        return [self._model(self.entries[key]) for key in sorted(self.entries)]

    @implements
    def Show(self, *, name: str) -> Model:
        return self._model(self._entry(name))

    # adding ---------------------------------------------------------------------

    def _source_fd(self, path: str | None, fd: FileDescriptor | None) -> tuple[int, bool]:
        """The descriptor to import from, and whether we opened it."""
        if (path is None) == (fd is None):
            raise InvalidParameter(parameter="path" if path is None else "fd")
        if fd is not None:
            return fd.fileno(), False
        assert path is not None
        if not path.startswith("/") or len(path) > MAX_PATH or "\0" in path:
            raise InvalidParameter(parameter="path")
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK), True
        except OSError:
            raise InvalidParameter(parameter="path") from None

    @implements
    async def Register(
        self,
        *,
        name: str,
        path: str | None = None,
        fd: FileDescriptor | None = None,
        sha256: str | None = None,
        pin: bool | None = None,
        source: str | None = None,
    ) -> Model:
        parsed = self._name(name)
        await authz.authorize(authz.MANAGE_MODELS, NotAuthorized)
        expected = self._digest(sha256)
        if source is not None and (len(source) > MAX_PATH or "\0" in source):
            raise InvalidParameter(parameter="source")
        source_fd, opened = self._source_fd(path, fd)
        try:
            info = os.fstat(source_fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidParameter(parameter="path" if opened else "fd")
            if info.st_size == 0:
                raise InvalidModel(reason="the file is empty")
            self._check_space(info.st_size)
            staged = await self._thread(staging.import_file, source_fd, self.tree)
        finally:
            if opened:
                os.close(source_fd)
        try:
            if expected is not None and staged.digest != expected:
                raise DigestMismatch(expected=expected, actual=staged.digest)
            try:
                model_info = await asyncio.to_thread(metadata.read_fd, staged.fd)
            except metadata.InvalidModel as error:
                raise InvalidModel(reason=str(error)) from None
            async with self.lock:
                linked = await self._thread(staged.link, self.tree)
                logger.info("%s: %s by %s%s", parsed, staged.digest, staged.method,
                            "" if linked else " (already stored)")
                blob = self.blobs.get(staged.digest) or self._blob(
                    staged.digest, staged.size, model_info)
                model = await self._bind(parsed, blob, source=source or path, pin=pin)
        finally:
            staged.close()
        self._reload_router()
        return model

    @implements
    async def Pull(
        self,
        *,
        reference: str,
        name: str | None = None,
        sha256: str | None = None,
        size: int | None = None,
        fd: FileDescriptor | None = None,
        restart: bool | None = None,
    ) -> AsyncIterator[AnnotatedResult]:
        try:
            ref = refs.parse(reference)
        except refs.InvalidReference as error:
            raise InvalidReference(reference=error.reference, reason=error.reason) from None
        parsed = self._name(name if name is not None else refs.default_name(ref))
        await authz.authorize(authz.MANAGE_MODELS, NotAuthorized)
        digest = self._digest(sha256)
        if digest is None:
            raise InvalidParameter(parameter="sha256")
        if size is not None and not 0 < size <= MAX_SIZE:
            raise InvalidParameter(parameter="size")
        if fd is not None:
            mode = os.fstat(fd.fileno()).st_mode
            if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISREG(mode)):
                raise InvalidParameter(parameter="fd")
        lock, users = self.digest_locks.get(digest, (asyncio.Lock(), 0))
        self.digest_locks[digest] = (lock, users + 1)
        acquire = asyncio.ensure_future(lock.acquire())
        try:
            if lock.locked():
                yield _progress("waiting", 0, size, digest)
            while not acquire.done():
                # Another pull of this blob runs: say so every few seconds,
                # within any client's reply timeout.
                done, _ = await asyncio.wait({acquire}, timeout=WAIT_REPORT)
                if not done:
                    yield _progress("waiting", 0, size, digest)
            blob = self.blobs.get(digest)
            if blob is not None and self.tree.exists(digest):
                async with self.lock:
                    model = await self._bind(parsed, blob, source=reference, pin=None)
                self._reload_router()
                yield _progress("done", blob.size, blob.size, digest, model)
                return
            if fd is None:
                raise InvalidParameter(parameter="fd")
            async for reply in self._receive(reference, parsed, digest, size, fd,
                                             restart=bool(restart)):
                yield reply
        finally:
            if acquire.done() and not acquire.cancelled():
                lock.release()
            else:
                acquire.cancel()
            lock, users = self.digest_locks[digest]
            if users == 1:
                del self.digest_locks[digest]
            else:
                self.digest_locks[digest] = (lock, users - 1)

    async def _receive(
        self, reference: str, parsed: names.ModelName, digest: str, size: int | None,
        fd: FileDescriptor, *, restart: bool,
    ) -> AsyncIterator[AnnotatedResult]:
        journal = await self.manifests.partial(digest)
        durable = journal.durable_bytes if journal is not None and journal.size == size else 0
        try:
            receiver = staging.Receiver(self.tree.partial(digest), digest=digest, size=size,
                                        durable=durable, restart=restart)
        except staging.Busy as error:
            raise PullFailed(reference=reference, status=0, reason=str(error)) from None
        if receiver.offset:
            logger.info("%s: resuming at byte %d", digest, receiver.offset)
        discard = finished = False
        try:
            try:
                if size is not None:
                    self._check_space(size - receiver.offset)
            except StoreFull:
                discard = receiver.offset == 0
                raise
            await self._thread(receiver.prepare, fd.fileno())
            await self._journal(receiver, reference)
            journaled = receiver.durable
            yield _progress("receiving", receiver.offset, size, digest)
            while True:
                try:
                    end = await self._thread(receiver.pump, time.monotonic() + REPORT_INTERVAL)
                except staging.Oversized as error:
                    discard = True
                    raise PullFailed(reference=reference, status=0, reason=str(error)) from None
                if receiver.durable != journaled:
                    await self._journal(receiver, reference)
                    journaled = receiver.durable
                if end:
                    break
                yield _progress("receiving", receiver.offset, size, digest)
            yield _progress("verifying", receiver.offset, size, digest)
            try:
                await self._thread(receiver.finish)
            except staging.Incomplete as error:
                raise PullFailed(reference=reference, status=0,
                                 reason=f"{error}; the partial is kept") from None
            except staging.Mismatch as error:
                discard = True
                raise DigestMismatch(expected=error.expected, actual=error.actual) from None
            try:
                info = await asyncio.to_thread(metadata.read_fd, receiver.fd)
            except metadata.InvalidModel as error:
                discard = True
                raise InvalidModel(reason=str(error)) from None
            async with self.lock:
                await self._thread(self.tree.adopt, receiver.path, digest)
                finished = True
                await self.manifests.forget_partial(digest)
                blob = self._blob(digest, receiver.offset, info)
                model = await self._bind(parsed, blob, source=reference, pin=None)
            logger.info("%s: pulled %s (%d bytes, %d resumed)", parsed, digest,
                        receiver.offset, receiver.resumed)
            self._reload_router()
            yield _progress("done", receiver.offset, receiver.offset, digest, model)
        finally:
            # Also on cancellation (the client left): wait for the thread in
            # flight, make what arrived durable, and journal it.
            await asyncio.shield(self._settle(receiver, reference, discard=discard,
                                              finished=finished))

    async def _journal(self, receiver: staging.Receiver, reference: str) -> None:
        await self.manifests.journal(Partial(
            digest=receiver.digest, size=receiver.size, durable_bytes=receiver.durable,
            source=reference, updated_usec=_usec(),
        ))

    async def _settle(self, receiver: staging.Receiver, reference: str, *, discard: bool,
                      finished: bool) -> None:
        try:
            if not discard and not finished:
                await asyncio.to_thread(receiver.checkpoint)
                await self._journal(receiver, reference)
            await asyncio.to_thread(receiver.close, discard=discard)
            if discard:
                await self.manifests.forget_partial(receiver.digest)
        except Exception:
            logger.exception("%s: cleaning up the partial failed", receiver.digest)

    # reading --------------------------------------------------------------------

    @implements
    async def OpenModel(self, *, name: str) -> OpenModelResult:
        # Weights are not public: root, runtimed (which loads them), or whom
        # polkit grants model.read (the syntrop group's operators, by the rule).
        await authz.authorize(authz.READ_MODELS, NotAuthorized, allow=(authz.RUNTIME_USER,))
        entry = self._entry(name)
        async with self.lock:
            try:
                fd = self.tree.open(entry.digest)
            except FileNotFoundError:
                logger.error("blob %s of %s:%s is missing", entry.digest, entry.name, entry.tag)
                raise ModelNotFound(name=f"{entry.name}:{entry.tag}") from None
            try:
                now = _usec()
                await self.manifests.touch(entry.key, now)
                self.entries[entry.key] = replace(entry, last_access_usec=now)
            except BaseException:
                os.close(fd)
                raise
        return {"fd": FileDescriptor(fd, should_close=True), "digest": entry.digest,
                "size": self.blobs[entry.digest].size}

    # changing -------------------------------------------------------------------

    @implements
    async def Remove(self, *, name: str) -> None:
        await authz.authorize(authz.MANAGE_MODELS, NotAuthorized)
        entry = self._entry(name)
        async with self.lock:
            entry = self.entries.get(entry.key) or entry
            if entry.key not in self.entries:
                raise ModelNotFound(name=f"{entry.name}:{entry.tag}")
            # Only the last name of a blob held open is refused: removing
            # another name of the same bytes removes no bytes.
            shared = any(e.digest == entry.digest and e.key != entry.key
                         for e in self.entries.values())
            if not shared and self.tree.in_use(entry.digest):
                raise ModelInUse(name=f"{entry.name}:{entry.tag}")
            await self.manifests.remove(keys=[entry.key])
            del self.entries[entry.key]
            await asyncio.to_thread(self.tree.unlink_name, entry.name, entry.tag,
                                    self.blobs[entry.digest].format)
            await self._collect([entry.digest])

    async def _set_pinned(self, name: str, pinned: bool) -> None:
        await authz.authorize(authz.MANAGE_MODELS, NotAuthorized)
        entry = self._entry(name)
        async with self.lock:
            current = self.entries.get(entry.key)
            if current is None:
                raise ModelNotFound(name=f"{entry.name}:{entry.tag}")
            await self.manifests.set_pinned(entry.key, pinned)
            self.entries[entry.key] = replace(current, pinned=pinned)

    @implements
    async def Pin(self, *, name: str) -> None:
        await self._set_pinned(name, True)

    @implements
    async def Unpin(self, *, name: str) -> None:
        await self._set_pinned(name, False)

    @implements
    async def Prune(
        self, *, budget_bytes: int | None = None, dry_run: bool | None = None
    ) -> PruneResult:
        await authz.authorize(authz.MANAGE_MODELS, NotAuthorized)
        if budget_bytes is not None and not 0 <= budget_bytes <= MAX_SIZE:
            raise InvalidParameter(parameter="budget_bytes")
        budget = budget_bytes if budget_bytes is not None else self.config.budget_bytes
        async with self.lock:
            sizes = {digest: blob.size for digest, blob in self.blobs.items()}
            if budget is None:
                return {"freed_bytes": 0, "removed": [], "remaining_bytes": sum(sizes.values())}
            in_use = {d for d in sizes if self.tree.in_use(d)}
            chosen = prune.plan(
                (prune.Candidate(name=e.name, tag=e.tag, digest=e.digest, pinned=e.pinned,
                                 last_access_usec=e.last_access_usec)
                 for e in self.entries.values()),
                sizes, budget, in_use,
            )
            if not dry_run:
                await self.manifests.remove(keys=chosen.names, digests=chosen.digests)
                for key in chosen.names:
                    entry = self.entries.pop(key)
                    await asyncio.to_thread(self.tree.unlink_name, entry.name, entry.tag,
                                            self.blobs[entry.digest].format)
                for digest in chosen.digests:
                    del self.blobs[digest]
                    await asyncio.to_thread(self.tree.delete, digest)
                if chosen.names or chosen.digests:
                    logger.info("pruned %s, %d bytes freed",
                                ", ".join(f"{n}:{t}" for n, t in chosen.names) or "orphans",
                                chosen.freed_bytes)
        return {
            "freed_bytes": chosen.freed_bytes,
            "removed": [f"{n}:{t}" for n, t in chosen.names],
            "remaining_bytes": chosen.remaining_bytes,
        }
