"""The writable binds of the tool process are taken as descriptors: a
directory swapped for a symlink after its check is refused, not followed."""

import os
from pathlib import Path

import pytest

from syntrop.system.sandbox import Layers, SandboxError, command, open_writable


def test_a_real_directory_becomes_a_bind_by_descriptor(tmp_path: Path) -> None:
    target = tmp_path / "a.service.d"
    target.mkdir()
    fds = open_writable([str(target)])
    try:
        argv = command("m", [str(target)], layers=Layers(landlock=False, seccomp=False),
                       fds=fds)
        at = argv.index("--bind-fd")
        assert argv[at + 1:at + 3] == [str(fds[str(target)]), str(target)]
        assert "--bind" not in argv
    finally:
        for fd in fds.values():
            os.close(fd)


@pytest.mark.parametrize("how", ["symlink", "symlinked parent", "missing"])
def test_a_swapped_or_missing_directory_is_refused(tmp_path: Path, how: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "inner").mkdir(parents=True)
    if how == "symlink":
        path = tmp_path / "a.service.d"
        path.symlink_to(elsewhere)
    elif how == "symlinked parent":
        (tmp_path / "system").symlink_to(elsewhere)
        path = tmp_path / "system" / "inner"
    else:
        path = tmp_path / "gone"
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(SandboxError):
        open_writable([str(tmp_path), str(path)])
    assert len(os.listdir("/proc/self/fd")) == before  # nothing left open
