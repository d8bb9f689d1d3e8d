"""The recorder: turns what the watchers report into timeline events, keeps
the shadows, and answers the timeline's questions.

Threads and ownership. The event loop owns the watcher, the ring, the
indexes of unit files and references, and the counters. One worker thread
owns the shadows: it reads files, hashes and diffs them (never the loop's
job), and hands back changes. SQLite runs on its own thread
(syntrop.system.sqlite). A change is written to SQLite, with the shadow
that produced it, before it enters the ring, so what a client can see
survives a crash.

Start-up. Shadows persisted by the last run are compared with the files now:
differences become events (timestamped with the file's modification time,
marked as found at start-up), so changes made while contextd was not running
are not lost; only the writer and the steps in between are. A root seen for
the first time is a baseline: its files are recorded silently.

Flood control. File and kernel events pass a token bucket; past it a change
still updates the shadow (so the next diff is right) but its event is
dropped and counted, and its diff is never computed. Paths waiting to be
looked at are bounded; past the bound everything is rescanned instead. An
inotify queue overflow also leads to a rescan.
"""

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from syntrop.contextd import units
from syntrop.contextd.config import Config
from syntrop.contextd.feeds import KernelFeed, PackageFeed
from syntrop.contextd.logtail import Position
from syntrop.contextd.packages import PackageFiles
from syntrop.contextd.shadow import Change, FileState, compare, snapshot
from syntrop.contextd.store import Batch, Store
from syntrop.contextd.timeline import Bucket, Record, Ring, rank
from syntrop.contextd.watcher import Notice, Watcher
from syntrop.system import fanotify as fan
from syntrop.system import inotify as ino

logger = logging.getLogger(__name__)

#: Paths waiting to be looked at, at most; past it: a full rescan.
MAX_PENDING = 8192
#: Paths looked at per round of the worker.
BATCH = 2048
#: Seconds to wait for a writer that created or modified a file but has not
#: closed it yet.
SETTLE = 0.2
#: Seconds a fanotify attribution stays valid.
ATTRIBUTION_TTL = 10.0
MAX_SUMMARY = 300


def now_usec() -> int:
    return time.time_ns() // 1000


@dataclass(slots=True)
class Examined:
    """What one round of the worker found."""

    changes: list[tuple[Change, FileState | None, bool]] = field(default_factory=list)
    shadows: dict[str, FileState | None] = field(default_factory=dict)
    subdirs: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    dropped: int = 0


@dataclass(slots=True)
class Counters:
    dropped: int = 0
    overflows: int = 0
    skipped: int = 0


class Recorder:
    def __init__(
        self, config: Config, store: Store, *, clock: Callable[[], int] = now_usec
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.ring = Ring(config.ring_size)
        self.counters = Counters()
        # File events are admitted by the worker (a dropped change costs no
        # diff), kernel events by the loop: one bucket each.
        self.file_bucket = Bucket(config.flood_rate, config.flood_burst, time.monotonic())
        self.bucket = Bucket(config.flood_rate, config.flood_burst, time.monotonic())
        roots = [os.path.realpath(d) for d in config.unit_dirs]
        self.inotify = ino.Inotify()
        self.watcher = Watcher(self.inotify, roots, max_watches=config.max_watches)
        self.fanotify: fan.Fanotify | None = None
        self.packages = PackageFiles(config.dpkg_info, config.reference_prefixes)
        # Owned by the worker thread once started:
        self.shadows: dict[str, FileState] = {}
        self.shadow_bytes = 0
        # Owned by the loop:
        self.unit_files: dict[str, set[str]] = {}  # "unit:<key>" -> paths present
        self.references: dict[str, units.References] = {}  # unit file path -> references
        self.attribution: dict[str, tuple[int, str | None, float]] = {}
        self.meta: dict[str, str] = {}
        self.positions: dict[str, Position] = {}
        #: package spec -> (first, last) timestamp of its events in the ring;
        #: kept as recorded (a spec whose events left the ring only costs a
        #: cached lookup).
        self.package_times: dict[str, tuple[int, int]] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextd-files")
        self._now: set[str] = set()
        self._later: dict[str, float] = {}
        self._scans: set[str] = set()
        self._gone: set[str] = set()
        self._rescan = False
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._settle_handle: asyncio.TimerHandle | None = None
        self.package_feed = PackageFeed(self)
        self.kernel_feed = KernelFeed(self)
        self._closed = False

    # start and stop ----------------------------------------------------------

    async def start(self) -> None:
        loaded = self.store.load(self.config.ring_size, self.clock() - self.config.retention_usec)
        for record in loaded.records:
            self.ring.add(record)
            self._note_package(record)
        self._last_id = int(loaded.meta.get("last_id", "0"))
        self.meta = loaded.meta
        self.positions = loaded.positions
        self.shadows = loaded.shadows
        self.shadow_bytes = sum(len(s.content or b"") for s in self.shadows.values())
        self._open_fanotify()
        loop = asyncio.get_running_loop()
        examined, baselined = await loop.run_in_executor(self._worker, self._initial)
        await self._commit_examined(examined, found_at_start=True,
                                    meta={"baselined": json.dumps(sorted(baselined))})
        # Index every shadow, not only those that changed while it was down.
        everything: dict[str, FileState | None] = dict(self.shadows)
        self._index(everything)
        await self._update_references(everything)
        loop.add_reader(self.inotify.fd, self._on_inotify)
        if self.fanotify is not None:
            loop.add_reader(self.fanotify.fd, self._drain_fanotify)
        await self.package_feed.start()
        self._tasks.append(asyncio.create_task(self._process(), name="contextd-files"))
        await self.kernel_feed.start()

    def _open_fanotify(self) -> None:
        try:
            self.fanotify = fan.Fanotify.open()
        except OSError as error:
            logger.info("fanotify unavailable (%s): writers are not named", error.strerror)
            self.fanotify = None

    def _mark(self, directory: str) -> None:
        if self.fanotify is not None and not self.fanotify.mark(directory):
            logger.debug("fanotify cannot mark %s", directory)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(self.inotify.fd)
        if self.fanotify is not None:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(self.fanotify.fd)
        if self._settle_handle is not None:
            self._settle_handle.cancel()
        await self.kernel_feed.close()
        await self.package_feed.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._worker.shutdown(wait=True)
        self.inotify.close()
        if self.fanotify is not None:
            self.fanotify.close()

    def keep_alive(self) -> bool:
        return not self.config.exit_on_idle

    # the worker thread ---------------------------------------------------------

    def _examine(self, path: str, found: Examined, *, quiet: bool = False) -> None:
        old = self.shadows.get(path)
        # The budget counts the old content as free: it is replaced.
        budget = self.config.max_shadow_bytes - self.shadow_bytes + len(
            old.content or b"" if old else b"")
        new = snapshot(path, max_file_bytes=self.config.max_file_bytes, budget=budget)
        if new is not None and new.kind == "dir":
            new = None  # a directory where a file was: the file is gone
        change = compare(path, old, new, max_diff_bytes=self.config.max_diff_bytes, diff=False)
        if change is None and (old is None or new is None or old.content == new.content):
            return
        if change is not None and not quiet:
            if self.file_bucket.take(time.monotonic()):
                change = compare(path, old, new, max_diff_bytes=self.config.max_diff_bytes)
            else:
                found.dropped += 1
                change = None
        self.shadow_bytes += len(new.content or b"") if new else 0
        self.shadow_bytes -= len(old.content or b"") if old else 0
        if new is None:
            self.shadows.pop(path, None)
        else:
            self.shadows[path] = new
        found.shadows[path] = new
        if change is not None:
            found.changes.append((change, new, quiet))

    def _scan(self, directory: str, found: Examined, *, quiet: bool = False,
              defer: bool = False) -> None:
        """Look at every tracked entry of a unit directory or subdirectory;
        report subdirectories to watch. With `defer`, (a directory that just
        appeared) its files may still be being written: they are reported to
        be looked at once settled, unless closing them says so first."""
        is_root = directory in self.watcher.roots
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if is_root and units.watched_subdir(entry.name):
                    found.subdirs.append(entry.path)
                continue
            relative = (entry.name,) if is_root else (os.path.basename(directory), entry.name)
            if units.role(relative) is None:
                continue
            if defer:
                found.deferred.append(entry.path)
            else:
                self._examine(entry.path, found, quiet=quiet)

    def _initial(self) -> tuple[Examined, set[str]]:
        """Start-up: watch, then compare every root with its shadows."""
        found = Examined()
        baselined = set(json.loads(self.meta.get("baselined", "[]")))
        self.watcher.start()
        for root in sorted(self.watcher.active):
            self._mark(root)
            quiet = root not in baselined
            sub = Examined()
            self._scan(root, sub, quiet=quiet)
            for directory in sub.subdirs:
                if self.watcher.watch_subdir(directory):
                    self._mark(directory)
                    self._scan(directory, sub, quiet=quiet)
            found.changes += sub.changes
            found.shadows.update(sub.shadows)
            baselined.add(root)
        # Shadows of files that are gone, and of referenced files.
        for path in list(self.shadows):
            if path not in found.shadows:
                self._examine(path, found)
        return found, baselined | self.watcher.active

    def _round(self, paths: list[str], scans: set[str], gone: set[str],
               rescan: list[str] | None) -> Examined:
        """One round: look at `paths`, scan `scans`, forget what was under
        `gone`; with `rescan` (the roots), look at everything."""
        found = Examined()
        if rescan is not None:
            paths = sorted(set(paths) | set(self.shadows))
            scans = scans | set(rescan)
        for prefix in gone:
            paths += [p for p in self.shadows if p.startswith(prefix.rstrip("/") + "/")]
        for path in dict.fromkeys(paths):
            self._examine(path, found)
        for directory in sorted(scans):
            self._scan(directory, found, defer=rescan is None)
        return found

    def _baseline(self, paths: list[str]) -> Examined:
        found = Examined()
        for path in paths:
            self._examine(path, found, quiet=True)
        return found

    # the loop --------------------------------------------------------------------

    def _on_inotify(self) -> None:
        notice = self.watcher.handle(self.inotify.read())
        self._take(notice)

    def _take(self, notice: Notice) -> None:
        if notice.overflow:
            self.counters.overflows += 1
            logger.warning("inotify queue overflowed: rescanning")
            self._rescan = True
        for source, target in notice.moves:
            if source in self.attribution:
                self.attribution[target] = self.attribution.pop(source)
        self._now |= notice.now
        deadline = time.monotonic() + SETTLE
        for path in notice.later:
            self._later.setdefault(path, deadline)
        for path in notice.now:
            self._later.pop(path, None)
        for directory in notice.scan:
            self._mark(directory)
        self._scans |= notice.scan
        self._gone |= notice.gone
        if len(self._now) + len(self._later) > MAX_PENDING:
            self.counters.overflows += 1
            self._now.clear()
            self._later.clear()
            self._rescan = True
        if self._later and self._settle_handle is None:
            self._settle_handle = asyncio.get_running_loop().call_later(SETTLE, self._settled)
        if self._now or self._scans or self._gone or self._rescan:
            self._wake.set()

    def _settled(self) -> None:
        self._settle_handle = None
        current = time.monotonic()
        due = [path for path, deadline in self._later.items() if deadline <= current]
        for path in due:
            del self._later[path]
        self._now.update(due)
        if self._later:
            self._settle_handle = asyncio.get_running_loop().call_later(SETTLE, self._settled)
        if due:
            self._wake.set()

    def _drain_fanotify(self) -> None:
        if self.fanotify is None:
            return
        current = time.monotonic()
        for write in self.fanotify.read():
            self.attribution[write.path] = (write.pid, write.comm, current)
        if len(self.attribution) > 4096:
            self.attribution = {p: a for p, a in self.attribution.items()
                                if current - a[2] < ATTRIBUTION_TTL}

    async def _process(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._on_inotify()  # whatever else is queued joins this round
            self._drain_fanotify()
            paths = sorted(self._now)[:BATCH]
            self._now.difference_update(paths)
            scans, self._scans = self._scans, set()
            gone, self._gone = self._gone, set()
            rescan = sorted(self.watcher.active) if self._rescan else None
            self._rescan = False
            try:
                found = await loop.run_in_executor(self._worker, self._round, paths, scans,
                                                   gone, rescan)
                for directory in found.subdirs:
                    if directory not in self.watcher.dirs and self.watcher.watch_subdir(directory):
                        self._mark(directory)
                        self._scans.add(directory)
                if found.deferred:
                    self._take(Notice(later=set(found.deferred) - self._now))
                await self._commit_examined(found)
                await self._update_references(found.shadows)
            except Exception:
                logger.exception("examining %d paths failed", len(paths))
            if self._now or self._scans or self._gone or self._rescan:
                self._wake.set()

    # turning changes into records ------------------------------------------------

    def _role(self, path: str) -> units.Role | None:
        directory, name = os.path.split(path)
        if directory in self.watcher.active:
            return units.role((name,))
        parent, sub = os.path.split(directory)
        if parent in self.watcher.active:
            return units.role((sub, name))
        return None

    def _file_record(self, change: Change, state: FileState | None, *,
                     found_at_start: bool) -> Record:
        role = self._role(change.path)
        if role is None:
            kind, unit, keys, label = "config", None, (f"path:{change.path}",), "config file"
            users = [u for u, r in self.references.items() if change.path in r.configs]
            if users:
                unit = os.path.basename(users[0])
        else:
            kind, unit, keys, label = role.kind, role.unit, (role.key,), role.label
        # When it was seen (within milliseconds of the write, and in the order
        # recorded); for a change made while contextd was not running, the
        # file's modification time is the only clue.
        timestamp = self.clock()
        if found_at_start and state is not None and change.action != "deleted":
            timestamp = min(state.mtime_ns // 1000, timestamp)
        pid = comm = None
        attributed = self.attribution.pop(change.path, None)
        if attributed is not None and time.monotonic() - attributed[2] < ATTRIBUTION_TTL:
            pid, comm = attributed[0], attributed[1]
        by = "" if pid is None else f" by {comm} (pid {pid})" if comm else f" by pid {pid}"
        when = " (found at start-up: changed while contextd was not running)" \
            if found_at_start else ""
        summary = f"{label} {change.path} {change.action}{by}: {change.detail}{when}"
        return Record(id=0, timestamp_usec=timestamp, kind=kind, action=change.action,
                      summary=_cap(summary), unit=unit, path=change.path, mode=change.mode,
                      pid=pid, comm=comm, has_diff=change.diff is not None, keys=keys)

    async def _commit_examined(self, found: Examined, *, found_at_start: bool = False,
                               meta: dict[str, str] | None = None) -> None:
        drafts = [
            (self._file_record(change, state, found_at_start=found_at_start), change.diff)
            for change, state, quiet in found.changes if not quiet
        ]
        self.counters.dropped += found.dropped
        await self.commit(drafts, shadows=found.shadows, meta=meta)
        self._index(found.shadows)

    def _index(self, shadows: dict[str, FileState | None]) -> None:
        """Which unit files and drop-ins exist, by unit key."""
        for path, state in shadows.items():
            role = self._role(path)
            if role is None or (role.kind == "unit_file" and role.key.startswith("wants:")):
                continue
            present = self.unit_files.setdefault(role.key, set())
            if state is None:
                present.discard(path)
                if not present:
                    del self.unit_files[role.key]
            else:
                present.add(path)

    async def _update_references(self, shadows: dict[str, FileState | None]) -> None:
        """Re-read the references of unit files and drop-ins that changed;
        watch the files they name."""
        changed = False
        for path, state in shadows.items():
            if self._role(path) is None:
                continue
            if state is None or state.content is None:
                changed |= self.references.pop(path, None) is not None
            else:
                refs = units.references(state.content.decode("utf-8", "replace"),
                                        self.config.reference_prefixes)
                if self.references.get(path) != refs:
                    self.references[path] = refs
                    changed = True
        if not changed:
            return
        wanted = [c for r in self.references.values() for c in r.configs]
        fresh = self.watcher.set_references(wanted[: self.config.max_references])
        for directory in {os.path.dirname(p) for p in fresh}:
            self._mark(directory)
        if fresh:
            loop = asyncio.get_running_loop()
            baseline = await loop.run_in_executor(self._worker, self._baseline, sorted(fresh))
            await self.commit([], shadows=baseline.shadows)

    async def commit(self, drafts: Iterable[tuple[Record, str | None]], *,
                     shadows: dict[str, FileState | None] | None = None,
                     positions: dict[str, Position | None] | None = None,
                     meta: dict[str, str] | None = None, limited: bool = False) -> list[Record]:
        """Give drafts their ids, persist them with the state that produced
        them, then add them to the ring."""
        async with self._lock:
            records: list[tuple[Record, str | None]] = []
            current = time.monotonic()
            for draft, diff in drafts:
                if limited and not self.bucket.take(current):
                    self.counters.dropped += 1
                    continue
                self._last_id += 1
                records.append((replace(draft, id=self._last_id), diff))
            batch = Batch(events=records, shadows=dict(shadows or {}),
                          positions=dict(positions or {}),
                          meta=dict(meta or {}),
                          prune_through=max(0, self._last_id - self.config.ring_size))
            if not batch:
                return []
            await self.store.write(batch)
            self.meta.update(batch.meta)
            for record, _ in records:
                self.ring.add(record)
                self._note_package(record)
            self.ring.evict_before(self.clock() - self.config.retention_usec)
            return [record for record, _ in records]

    # questions -------------------------------------------------------------------

    def unit_references(self, unit: str) -> units.References:
        configs: list[str] = []
        programs: list[str] = []
        for relative in units.files_of(unit):
            key = f"unit:{relative[0].removesuffix('.d')}"
            for path in self.unit_files.get(key, ()):
                refs = self.references.get(path)
                if refs is not None:
                    configs += refs.configs
                    programs += refs.programs
        return units.References(tuple(dict.fromkeys(configs)), tuple(dict.fromkeys(programs)))

    def known(self, unit: str) -> bool:
        keys = units.unit_keys(unit)
        if any(key in self.unit_files for key in keys):
            return True
        return any(next(self.ring.keyed(key), None) is not None
                   for key in keys if key.startswith(("unit:", "wants:", "kernel:unit:"))
                   and not key.startswith("unit:*."))

    def context(self, unit: str, *, failure_usec: int, since_usec: int, until_usec: int,
                pids: Iterable[int], owners: dict[str, float],
                limit: int) -> list[tuple[Record, float]]:
        """The ranked events that may explain `unit`'s failure. `owners`:
        weights of package names found to ship the unit's files."""
        refs = self.unit_references(unit)
        keys = units.unit_keys(unit)
        for path in refs.configs:
            keys[f"path:{path}"] = units.WEIGHTS["path"]
        for pid in pids:
            keys[f"kernel:pid:{pid}"] = units.WEIGHTS["kernel:pid"]
        for program in refs.programs:
            keys[f"kernel:comm:{os.path.basename(program)[:15]}"] = units.WEIGHTS["kernel:pid"]
        for name, weight in owners.items():
            keys[f"pkg:{name}"] = max(weight, keys.get(f"pkg:{name}", 0.0))
        found = self.ring.select(keys, since_usec, until_usec, pivot_usec=failure_usec,
                                 per_key=limit)
        return rank(found, failure_usec, limit)

    def _note_package(self, record: Record) -> None:
        if record.kind != "package":
            return
        for key in record.keys:
            if key.startswith("spec:"):
                first, last = self.package_times.get(key[5:], (record.timestamp_usec,) * 2)
                self.package_times[key[5:]] = (min(first, record.timestamp_usec),
                                               max(last, record.timestamp_usec))

    def package_names(self, since_usec: int, until_usec: int) -> set[str]:
        """Package specs (name[:arch]) with events in the window."""
        return {spec for spec, (first, last) in self.package_times.items()
                if first <= until_usec and last >= since_usec}

    def owners(self, unit: str, specs: Iterable[str]) -> dict[str, float]:
        """Of these packages, those that ship the unit's file (weight
        "ships") or a file it runs or reads ("owns"). Blocking when the lists
        are not cached yet (reads dpkg's lists)."""
        refs = self.unit_references(unit)
        stem, _, kind = unit.rpartition(".")
        names = {unit}
        if "@" in stem:
            names.add(f"{stem.partition('@')[0]}@.{kind}")
        files = set(refs.configs) | set(refs.programs)
        found: dict[str, float] = {}
        for spec in specs:
            shipped_units, shipped_files = self.packages.of(spec)
            name = spec.partition(":")[0]
            if names & shipped_units:
                found[name] = units.WEIGHTS["ships"]
            elif files & shipped_files:
                found[name] = units.WEIGHTS["owns"]
        return found

    async def diffs(self, ids: Iterable[int]) -> dict[int, str]:
        return await self.store.diffs(ids)

    @property
    def shadow_total(self) -> int:
        return self.shadow_bytes


def _cap(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 1] + "…"

