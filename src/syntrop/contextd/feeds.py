"""The two feeds besides files: package logs and kernel messages.

PackageFeed reads dpkg.log, apt's history.log and dnf.rpm.log from their
remembered positions (syntrop.contextd.logtail) whenever their directory
says they changed, and once at start-up; the events and the new position are
one transaction, so a line is recorded once.

KernelFeed follows `journalctl --dmesg --follow` from its remembered cursor,
classifies each message (syntrop.contextd.kernel) and records those that
matter. A journal given as --file cannot be followed; it is read up to date
before each answer instead. journalctl exiting is retried with a growing
delay (1 s doubling to 60 s).
"""

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from syntrop.contextd import journal, kernel, logtail, packages
from syntrop.contextd.timeline import Record
from syntrop.system import inotify as ino
from syntrop.system import journal as journalctl

if TYPE_CHECKING:
    from syntrop.contextd.config import Config
    from syntrop.contextd.logtail import Position


class Skipped(Protocol):
    skipped: int


class Store(Protocol):
    """What a feed needs of the recorder (recorder.py), which owns the feeds:
    its configuration, counters, clock, read positions and metadata, and
    commit. A protocol, so that feeds.py does not import recorder.py."""

    @property
    def config(self) -> "Config": ...
    @property
    def counters(self) -> Skipped: ...
    @property
    def clock(self) -> Callable[[], int]: ...
    @property
    def meta(self) -> dict[str, str]: ...
    @property
    def positions(self) -> "dict[str, Position]": ...

    async def commit(self, drafts: Any, *, positions: "dict[str, Position | None] | None" = None,
                     meta: dict[str, str] | None = None,
                     limited: bool = False) -> list[Record]: ...

logger = logging.getLogger(__name__)

#: Seconds to let a package manager finish a burst of lines before reading.
COALESCE = 0.1
MAX_KEYS = 130


def package_draft(record: packages.PackageRecord) -> Record:
    keys = ["package"]
    specs = list(record.packages)
    if record.package:
        specs.insert(0, f"{record.package}:{record.arch}" if record.arch else record.package)
    for spec in specs:
        keys += [f"pkg:{spec.partition(':')[0]}", f"spec:{spec}"]
    if record.path:
        keys.append(f"path:{record.path}")
    return Record(id=0, timestamp_usec=record.timestamp_usec, kind="package",
                  action=record.action, summary=record.summary, package=record.package,
                  path=record.path, keys=tuple(dict.fromkeys(keys))[:MAX_KEYS])


def kernel_draft(event: kernel.KernelEvent, timestamp_usec: int) -> Record:
    keys = []
    if event.action != "segfault":
        keys.append("kernel")
    if event.unit:
        keys.append(f"kernel:unit:{event.unit}")
    if event.pid is not None:
        keys.append(f"kernel:pid:{event.pid}")
    if event.comm:
        keys.append(f"kernel:comm:{event.comm[:15]}")
    return Record(id=0, timestamp_usec=timestamp_usec, kind="kernel", action=event.action,
                  summary=event.summary, unit=event.unit, pid=event.pid, comm=event.comm,
                  keys=tuple(keys))


class PackageFeed:
    def __init__(self, recorder: Store) -> None:
        self.recorder = recorder
        config = recorder.config
        self.logs: list[tuple[str, str]] = [
            (path, kind) for path, kind in (
                (config.dpkg_log, "dpkg"), (config.apt_history, "apt"), (config.dnf_log, "dnf"))
            if path
        ]
        self.inotify: ino.Inotify | None = None
        self._wds: dict[int, set[str]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._read_lock = asyncio.Lock()

    async def start(self) -> None:
        if not self.logs:
            return
        self.inotify = ino.Inotify()
        names: dict[str, set[str]] = {}
        for path, _ in self.logs:
            directory, name = os.path.split(path)
            names.setdefault(directory, set()).add(name)
        mask = (ino.MODIFY | ino.CLOSE_WRITE | ino.CREATE | ino.MOVED_TO | ino.MOVED_FROM
                | ino.DELETE | ino.ONLYDIR)
        for directory, wanted in names.items():
            try:
                self._wds[self.inotify.add_watch(directory, mask)] = wanted
            except OSError as error:
                logger.info("not watching %s for package logs: %s", directory, error.strerror)
        asyncio.get_running_loop().add_reader(self.inotify.fd, self._on_event)
        await self.read()
        self._task = asyncio.create_task(self._run(), name="contextd-packages")

    def _on_event(self) -> None:
        assert self.inotify is not None
        for event in self.inotify.read():
            if event.mask & ino.Q_OVERFLOW or any(
                    event.name.startswith(name) for name in self._wds.get(event.wd, ())):
                self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(COALESCE)
            self._wake.clear()
            try:
                await self.read()
            except Exception:
                logger.exception("reading package logs failed")

    async def read(self) -> None:
        """Read every log up to date."""
        async with self._read_lock:
            for path, kind in self.logs:
                await self._read_one(path, kind)

    async def _read_one(self, path: str, kind: str) -> None:
        recorder = self.recorder
        complete: Callable[[bytes], int] = (
            packages.apt_complete if kind == "apt" else logtail.lines_complete)
        while True:
            position = recorder.positions.get(path)
            chunks, new = await asyncio.to_thread(logtail.read_new, path, position, complete)
            parsed = packages.Parsed([])
            for chunk in chunks:
                text = chunk.decode("utf-8", "replace")
                if kind == "dpkg":
                    part = packages.parse_dpkg(text)
                elif kind == "apt":
                    part = packages.parse_apt(packages.split_apt(text))
                else:
                    part = packages.parse_dnf(text)
                parsed.records += part.records
                parsed.skipped += part.skipped
            recorder.counters.skipped += parsed.skipped
            oldest = recorder.clock() - recorder.config.retention_usec
            drafts = [(package_draft(r), None) for r in parsed.records
                      if r.timestamp_usec >= oldest]
            if new != position:
                await recorder.commit(drafts, positions={path: new})
                if new is None:
                    recorder.positions.pop(path, None)
                else:
                    recorder.positions[path] = new
            if not chunks:
                return

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.inotify is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self.inotify.fd)
            self.inotify.close()


class KernelFeed:
    def __init__(self, recorder: Store) -> None:
        self.recorder = recorder
        self.source = recorder.config.journal
        self.enabled = recorder.config.kernel
        self._task: asyncio.Task[None] | None = None
        self._stamp: tuple[float, int] | None = None
        self._poll_lock = asyncio.Lock()
        self._cursor_saved = 0.0

    @property
    def cursor(self) -> str | None:
        return self.recorder.meta.get("kernel_cursor") or None

    async def start(self) -> None:
        if self.enabled and self.source.can_follow:
            self._task = asyncio.create_task(self._follow(), name="contextd-kernel")

    def _draft(self, raw: dict[str, Any]) -> Record | None:
        stamp = journal.line_of(raw)
        if stamp is None:
            self.recorder.counters.skipped += 1
            return None
        self.recorder.meta["kernel_cursor"] = stamp.cursor
        event = kernel.classify(stamp.message)
        return None if event is None else kernel_draft(event, stamp.timestamp_usec)

    async def _follow(self) -> None:
        delay = 1.0
        while True:
            since = self.recorder.clock() - self.recorder.config.retention_usec
            argv = journal.kernel_argv(self.source, self.cursor, since, follow=True)
            started = time.monotonic()
            try:
                async for raw in journalctl.follow(argv):
                    draft = None if raw is None else self._draft(raw)
                    if raw is None:
                        self.recorder.counters.skipped += 1
                    await self._save(draft)
            except OSError as error:
                logger.warning("cannot follow the kernel log: %s, ignoring", error.strerror)
            except Exception:
                logger.exception("following the kernel log failed")
            if time.monotonic() - started > 60:
                delay = 1.0
            # Said once per run of failures (a host without a journal would
            # otherwise log this every minute).
            logger.log(logging.INFO if delay == 1.0 else logging.DEBUG,
                       "journalctl for kernel messages exited; again in %.0f s", delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)

    async def _save(self, draft: Record | None) -> None:
        current = time.monotonic()
        if draft is not None or current - self._cursor_saved > 5:
            self._cursor_saved = current
            await self.recorder.commit(
                [] if draft is None else [(draft, None)], limited=True,
                meta={"kernel_cursor": self.recorder.meta.get("kernel_cursor", "")})

    async def poll(self) -> None:
        """Read a --file journal up to date (it cannot be followed); only
        when a file changed since the last time."""
        if not self.enabled or self.source.can_follow:
            return
        stamp = (0.0, 0)
        for path in self.source.files:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                stamp = (max(stamp[0], st.st_mtime), stamp[1] + st.st_size)
        async with self._poll_lock:
            if stamp == self._stamp:
                return
            since = self.recorder.clock() - self.recorder.config.retention_usec
            argv = journal.kernel_argv(self.source, self.cursor, since, follow=False)
            result = await asyncio.to_thread(journalctl.read, argv, limit=100_000)
            self.recorder.counters.skipped += result.skipped
            drafts = [(d, None) for d in map(self._draft, result.entries) if d is not None]
            await self.recorder.commit(drafts, limited=True, meta={
                "kernel_cursor": self.recorder.meta.get("kernel_cursor", "")})
            if result.error is None:
                self._stamp = stamp

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        cursor = self.recorder.meta.get("kernel_cursor")
        if cursor:
            with contextlib.suppress(Exception):
                await self.recorder.commit([], meta={"kernel_cursor": cursor})
