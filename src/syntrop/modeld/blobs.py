"""The store on disk.

    <store>/blobs/sha256/<hex>            verified blobs, mode 0444, named by their SHA-256
    <store>/by-name/<name>/<tag>.<format>  hard links to those blobs, one per name:tag
    <store>/partial/<hex>                 journaled partial pulls (never a final path)
    <store>/modeld.db                     manifests (store.py)

A file appears under blobs/ only by link(2) or linkat(2) of bytes already
verified, so no reader can see a partial or unverified blob. The by-name tree
is derived from the manifests and rebuilt at start.

In use: OpenModel takes a shared flock on the descriptor it hands out. A flock
belongs to the open file description, which SCM_RIGHTS shares with the
receiver, so the blob counts as in use until the last copy of that
descriptor is closed, even across a restart of modeld.
"""

import contextlib
import logging
import os
from pathlib import Path

from syntrop.system import files

logger = logging.getLogger(__name__)


class BlobTree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.by_name = root / "by-name"
        self.partials = root / "partial"
        for directory in (self.blobs, self.by_name, self.partials):
            directory.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.blobs / digest

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def partial(self, digest: str) -> Path:
        return self.partials / digest

    # adding -------------------------------------------------------------------

    def link_anonymous(self, fd: int, digest: str) -> bool:
        """Name a verified anonymous file. False when the blob was there already.

        Blobs are 0444 whatever the umask (the unit's is 0077): runtimed opens
        the descriptor it is handed through /proc/self/fd/N, and that open
        checks the inode's mode against runtimed's own user. The store's
        directory stays 0700, so nobody reaches a blob by its path."""
        os.fchmod(fd, 0o444)
        try:
            files.link_anonymous(fd, self.path(digest))
        except FileExistsError:
            return False
        files.fsync_directory(self.blobs)
        return True

    def adopt(self, path: Path, digest: str) -> bool:
        """Move a verified named file (a finished partial) into place without
        ever replacing an existing blob. False when the blob was there already."""
        os.chmod(path, 0o444)
        try:
            os.link(path, self.path(digest))
            linked = True
        except FileExistsError:
            linked = False
        os.unlink(path)
        files.fsync_directory(self.blobs)
        return linked

    # reading ------------------------------------------------------------------

    def open(self, digest: str) -> int:
        """An O_RDONLY descriptor of the blob, marked as in use (shared flock)."""
        fd = os.open(self.path(digest), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            files.lock_shared(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def in_use(self, digest: str) -> bool:
        return files.held_elsewhere(self.path(digest))

    # removing -----------------------------------------------------------------

    def delete(self, digest: str) -> None:
        files.unlink_quietly(self.path(digest))

    # the by-name tree -----------------------------------------------------------

    def name_path(self, name: str, tag: str, format: str) -> Path:
        return self.by_name / name / f"{tag}.{format}"

    def link_name(self, name: str, tag: str, format: str, digest: str) -> None:
        """by-name/<name>/<tag>.<format> → the blob, replaced atomically."""
        target = self.name_path(name, tag, format)
        target.parent.mkdir(exist_ok=True)
        blob = self.path(digest)
        with contextlib.suppress(OSError):
            if os.path.samefile(blob, target):
                return  # already this blob: rename(2) onto the same inode would keep both names
        temporary = target.parent / f".{tag}.{os.urandom(4).hex()}.tmp"
        os.link(blob, temporary)
        try:
            os.replace(temporary, target)
        finally:
            files.unlink_quietly(temporary)  # left only when the rename was a no-op or failed

    def unlink_name(self, name: str, tag: str, format: str) -> None:
        path = self.name_path(name, tag, format)
        files.unlink_quietly(path)
        with contextlib.suppress(OSError):  # other tags remain
            path.parent.rmdir()

    def sweep(self, digests: set[str], names: dict[tuple[str, str], tuple[str, str]]) -> None:
        """Make the tree match the manifests after a start: remove blobs no row
        knows (a crash between link and commit), stale temporaries and names,
        and (re)link every name. `names`: (name, tag) -> (format, digest)."""
        for entry in os.scandir(self.blobs):
            if entry.name not in digests:
                logger.info("removing orphan blob %s", entry.name)
                files.unlink_quietly(Path(entry.path))
        wanted = {
            self.name_path(name, tag, format): digest
            for (name, tag), (format, digest) in names.items()
        }
        for directory in list(os.scandir(self.by_name)):
            if not directory.is_dir(follow_symlinks=False):
                files.unlink_quietly(Path(directory.path))
                continue
            for entry in os.scandir(directory.path):
                path = Path(entry.path)
                if path not in wanted:
                    files.unlink_quietly(path)
            with contextlib.suppress(OSError):
                os.rmdir(directory.path)
        for path, digest in wanted.items():
            try:
                same = path.stat().st_ino == self.path(digest).stat().st_ino
            except FileNotFoundError:
                same = False
            if not same and self.exists(digest):
                name, tag_format = path.parent.name, path.name
                tag, _, format = tag_format.rpartition(".")
                self.link_name(name, tag, format, digest)
