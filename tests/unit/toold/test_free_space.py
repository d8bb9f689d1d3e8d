"""free_space's pure parts: which paths it accepts, and how it counts the
journal (only journal files, on disk, no symlink followed)."""

import os
from pathlib import Path

import pytest

from syntrop.toold import errors
from syntrop.toold.tools.free_space import FreeSpace, device, journal_bytes, path_error, usage


@pytest.mark.parametrize(("path", "why"), [
    ("/var/lib/pg/wal", None), ("/", None), ("var/lib", "must be an absolute path"),
    ("/var/../etc", "must be a normalized path"), ("/var//lib", "must be a normalized path"),
    ("/var/lib/", "must be a normalized path"), ("/var/./lib", "must be a normalized path"),
])
def test_a_path_must_be_absolute_and_normalized(path: str, why: str | None) -> None:
    assert path_error(path) == why


def test_the_parameters_are_a_unit_and_a_path() -> None:
    tool = FreeSpace()
    assert tool.validate({"unit": "pg.service", "path": "/srv/pg"}) == {
        "unit": "pg.service", "path": "/srv/pg"}
    for bad in ({"unit": "pg.service"}, {"unit": "pg.service", "path": "srv"},
                {"unit": "pg.service", "path": "/srv", "size": 1}):
        with pytest.raises(errors.BadArgument):
            tool.validate(bad)


def test_the_journal_is_its_files_on_disk_and_nothing_else(tmp_path: Path) -> None:
    machine = tmp_path / "journal" / "0123"
    machine.mkdir(parents=True)
    (machine / "system.journal").write_bytes(b"j" * 40960)
    (machine / "user-1000@0001-0002.journal~").write_bytes(b"j" * 8192)
    (machine / "notes.txt").write_bytes(b"n" * 100_000)
    outside = tmp_path / "outside.journal"
    outside.write_bytes(b"o" * 100_000)
    os.symlink(outside, machine / "linked.journal")
    counted = journal_bytes([str(tmp_path / "journal")])
    on_disk = sum(os.stat(machine / n).st_blocks * 512
                  for n in ("system.journal", "user-1000@0001-0002.journal~"))
    assert counted == on_disk and counted >= 40960 + 8192


def test_a_path_not_yet_there_is_on_its_parent_s_filesystem(tmp_path: Path) -> None:
    assert device(str(tmp_path / "not" / "yet")) == os.stat(tmp_path).st_dev
    found = usage(str(tmp_path / "not" / "yet"))
    assert 0 <= found.free <= found.size
