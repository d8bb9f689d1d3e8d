"""Which models to remove so the store fits its budget. Pure.

The store's size is the sum of its blobs' sizes (a blob shared by several
names counts once). Removing a name frees nothing while another name uses
its blob, so the unit of pruning is the blob with all its names, least
recently used first (a blob's last use is the latest of its names'). A blob
with a pinned name, or in use, is never chosen; a blob no name uses any more
(and not in use) goes first.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    name: str
    tag: str
    digest: str
    pinned: bool
    last_access_usec: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    #: (name, tag) of each name to remove, in order.
    names: list[tuple[str, str]]
    #: Blobs left without a name, to delete.
    digests: list[str]
    freed_bytes: int
    #: Size of the store after the plan.
    remaining_bytes: int


def plan(
    entries: Iterable[Candidate],
    sizes: Mapping[str, int],
    budget: int,
    in_use: set[str],
) -> Plan:
    by_digest: dict[str, list[Candidate]] = {}
    for entry in entries:
        by_digest.setdefault(entry.digest, []).append(entry)
    total = sum(sizes.values())
    removed_names: list[tuple[str, str]] = []
    removed_digests: list[str] = []
    freed = 0

    def order(digest: str) -> tuple[int, int, str]:
        users = by_digest.get(digest, [])
        last = max((e.last_access_usec for e in users), default=-1)
        return (1 if users else 0, last, digest)

    for digest in sorted(sizes, key=order):
        if total - freed <= budget:
            break
        users = by_digest.get(digest, [])
        if digest in in_use or any(e.pinned for e in users):
            continue
        removed_names += [(e.name, e.tag) for e in sorted(users, key=lambda e: (e.name, e.tag))]
        removed_digests.append(digest)
        freed += sizes[digest]
    return Plan(names=removed_names, digests=removed_digests, freed_bytes=freed,
                remaining_bytes=total - freed)
