"""Which directories are watched, and what an inotify event means to us.

Watched: each unit directory (a root), its drop-in and link subdirectories
(foo.service.d/, multi-user.target.wants/), and the directories of files
units reference (EnvironmentFile=), filtered to those names. A root that
does not exist yet is waited for: its nearest existing ancestor is watched
until the path appears. New subdirectories are watched as they appear and
then scanned, so files written into them before the watch took are found.

`Watcher.handle()` turns raw events into a `Notice`: paths to look at now
(written and closed, renamed, deleted, attributes), paths to look at once
the writer is done (created or modified but not closed yet), directories to
scan, directories gone, renames (for fanotify's attribution) and whether the
kernel's queue overflowed (then everything is rescanned).

The inotify adapter is passed in; nothing here reads files.
"""

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from syntrop.contextd.units import role, watched_subdir
from syntrop.system import inotify as ino

logger = logging.getLogger(__name__)

MASK = (ino.CREATE | ino.DELETE | ino.MOVED_FROM | ino.MOVED_TO | ino.CLOSE_WRITE | ino.MODIFY
        | ino.ATTRIB | ino.DELETE_SELF | ino.MOVE_SELF | ino.ONLYDIR | ino.DONT_FOLLOW
        | ino.EXCL_UNLINK)
_NOW = ino.CLOSE_WRITE | ino.MOVED_TO | ino.MOVED_FROM | ino.DELETE | ino.ATTRIB
_LATER = ino.CREATE | ino.MODIFY


@dataclass(slots=True)
class Notice:
    now: set[str] = field(default_factory=set)
    later: set[str] = field(default_factory=set)
    scan: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    moves: list[tuple[str, str]] = field(default_factory=list)
    overflow: bool = False


class Watcher:
    def __init__(self, inotify: ino.Inotify, roots: Iterable[str], *, max_watches: int) -> None:
        self.inotify = inotify
        self.max_watches = max_watches
        self.roots: list[str] = list(dict.fromkeys(os.path.normpath(r) for r in roots))
        self.active: set[str] = set()  # roots that exist and are watched
        self.dirs: dict[str, int] = {}
        self.wds: dict[int, str] = {}
        self.references: dict[str, set[str]] = {}  # directory -> file names
        self.refused = 0  # watches refused (limit, ENOSPC, EACCES)
        self._tracked: dict[str, bool] = {}

    # watches -------------------------------------------------------------

    def _add(self, directory: str) -> bool:
        if directory in self.dirs:
            return True
        if len(self.dirs) >= self.max_watches:
            self.refused += 1
            logger.warning("not watching %s: %d watches is the limit, ignoring", directory,
                           self.max_watches)
            return False
        try:
            wd = self.inotify.add_watch(directory, MASK)
        except OSError as error:
            if not isinstance(error, (FileNotFoundError, NotADirectoryError)):
                self.refused += 1
                logger.warning("cannot watch %s: %s, ignoring", directory, error.strerror)
            return False
        old = self.wds.get(wd)
        if old is not None and old != directory:  # the same inode under another name
            self.dirs.pop(old, None)
        self.dirs[directory] = wd
        self.wds[wd] = directory
        return True

    def _drop(self, directory: str) -> None:
        wd = self.dirs.pop(directory, None)
        if wd is not None:
            self.wds.pop(wd, None)
            self.inotify.rm_watch(wd)

    def _drop_under(self, prefix: str) -> None:
        for directory in [d for d in self.dirs if d == prefix or d.startswith(prefix + "/")]:
            if directory in self.references or self._ancestor_of_pending(directory):
                continue
            self._drop(directory)

    def start(self) -> set[str]:
        """Watch what exists; the roots to scan."""
        return self._activate()

    def _activate(self) -> set[str]:
        """Watch roots that now exist (and wait for the others); the roots
        newly watched."""
        fresh = set()
        for root in self.roots:
            if root in self.active:
                continue
            if self._add(root):
                self.active.add(root)
                fresh.add(root)
                self._tracked.clear()
            else:
                ancestor = os.path.dirname(root)
                while ancestor != "/" and not os.path.isdir(ancestor):
                    ancestor = os.path.dirname(ancestor)
                self._add(ancestor)
        return fresh

    def _ancestor_of_pending(self, directory: str) -> bool:
        return any(root.startswith(directory.rstrip("/") + "/")
                   for root in self.roots if root not in self.active)

    def watch_subdir(self, directory: str) -> bool:
        """Watch a subdirectory a scan found; whether it is watched now."""
        return self._add(directory)

    def set_references(self, files: Iterable[str]) -> set[str]:
        """Watch the directories of these files (for those names only);
        the files newly watched, to be looked at."""
        wanted: dict[str, set[str]] = {}
        for path in files:
            directory, name = os.path.split(os.path.normpath(path))
            wanted.setdefault(directory, set()).add(name)
        added = set()
        for directory, names in wanted.items():
            before = self.references.get(directory, set())
            if directory not in self.dirs and not self._add(directory):
                continue
            added |= {os.path.join(directory, n) for n in names - before}
        for directory in set(self.references) - set(wanted):
            if not self._is_unit_dir(directory) and not self._ancestor_of_pending(directory):
                self._drop(directory)
        self.references = {d: n for d, n in wanted.items() if d in self.dirs}
        self._tracked.clear()
        return added

    def _is_unit_dir(self, directory: str) -> bool:
        if directory in self.active:
            return True
        parent, name = os.path.split(directory)
        return parent in self.active and watched_subdir(name)

    @property
    def watched(self) -> list[str]:
        return sorted(self.dirs)

    # events --------------------------------------------------------------

    def tracked(self, path: str) -> bool:
        """Whether a file path is one we keep a shadow of."""
        known = self._tracked.get(path)
        if known is None:
            if len(self._tracked) > 65536:
                self._tracked.clear()
            known = self._tracked[path] = self._is_tracked(path)
        return known

    def _is_tracked(self, path: str) -> bool:
        directory, name = os.path.split(path)
        if name in self.references.get(directory, ()):
            return True
        if directory in self.active:
            return role((name,)) is not None
        parent, sub = os.path.split(directory)
        return parent in self.active and role((sub, name)) is not None

    def handle(self, events: Iterable[ino.RawEvent]) -> Notice:
        notice = Notice()
        moved_from: dict[int, str] = {}
        for event in events:
            if event.mask & ino.Q_OVERFLOW:
                notice.overflow = True
                continue
            directory = self.wds.get(event.wd)
            if directory is None:
                continue
            if event.mask & ino.IGNORED:
                self.wds.pop(event.wd, None)
                if self.dirs.get(directory) == event.wd:
                    del self.dirs[directory]
                continue
            if not event.name:
                if event.mask & (ino.DELETE_SELF | ino.MOVE_SELF):
                    self._lost(directory, notice)
                continue
            path = os.path.join(directory, event.name)
            if event.mask & ino.ISDIR:
                self._directory_event(directory, event, path, notice)
                continue
            if event.mask & ino.MOVED_FROM:
                moved_from[event.cookie] = path
            elif event.mask & ino.MOVED_TO and event.cookie in moved_from:
                notice.moves.append((moved_from.pop(event.cookie), path))
            if not self.tracked(path):
                continue
            if event.mask & _NOW:
                notice.now.add(path)
                notice.later.discard(path)
            elif event.mask & _LATER and path not in notice.now:
                notice.later.add(path)
        return notice

    def _directory_event(self, directory: str, event: ino.RawEvent, path: str,
                         notice: Notice) -> None:
        appeared = bool(event.mask & (ino.CREATE | ino.MOVED_TO))
        gone = bool(event.mask & (ino.DELETE | ino.MOVED_FROM))
        if directory in self.active and watched_subdir(event.name):
            if appeared and self._add(path):
                notice.scan.add(path)
            elif gone:
                self._drop_under(path)
                notice.gone.add(path)
            return
        if (appeared and self._ancestor_of_pending(path)) or path in self.roots:
            notice.scan |= self._activate()
        if gone and path in self.roots:
            self._lost(path, notice)

    def _lost(self, directory: str, notice: Notice) -> None:
        """A watched directory was deleted or moved away."""
        if directory in self.active:
            self.active.discard(directory)
            self._tracked.clear()
            self._drop_under(directory)
            notice.gone.add(directory)
            self._activate()  # wait for it to come back
        elif self._is_unit_dir(directory):
            self._drop_under(directory)
            notice.gone.add(directory)
        else:
            self._drop(directory)
