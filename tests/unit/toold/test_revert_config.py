"""revert_config's pure parts: the path checks, the content before contextd's
latest change, and prepare refusing a path with no exact history."""

import asyncio
import difflib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from syntrop.toold import dropins, errors
from syntrop.toold.config import Config
from syntrop.toold.dropins import Change
from syntrop.toold.tools import TOOL_TYPES
from syntrop.toold.tools.revert_config import BadPath, RevertConfig, path_error, previous, read_file

BROKEN = "PORT=80\nMODE=broken\n"
GOOD = "PORT=80\nMODE=fine\n"


def unified(before: str, after: str, path: str = "/etc/demo/demo.env") -> str:
    """A diff exactly as contextd writes it (shadow.py)."""
    lines = difflib.unified_diff(before.splitlines(keepends=True),
                                 after.splitlines(keepends=True),
                                 fromfile=f"a{path}", tofile=f"b{path}", n=3)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)


def change(action: str, diff: str | None, at: int = 10_000_000) -> Change:
    return Change(name="demo.env", action=action, timestamp_usec=at, diff=diff)


def test_it_is_registered() -> None:
    assert TOOL_TYPES["revert_config"] is RevertConfig


@pytest.mark.parametrize("path", ["/etc/demo/demo.env", "/etc/demo.conf",
                                  "/etc/systemd/system/a.service.d/x.conf"])
def test_a_path_under_etc_is_accepted_as_written(path: str) -> None:
    assert path_error(path) is None


@pytest.mark.parametrize("path", ["etc/demo.conf", "demo.conf", "/etc/../root/x", "/etc/./x",
                                  "/etc//x", "/etc/x/", "/etc", "/etc/", "/etcx/a", "/var/a",
                                  "/run/systemd/system/a.service"])
def test_a_path_not_plainly_under_etc_is_refused_naming_the_parameter(path: str) -> None:
    assert path_error(path) is not None
    with pytest.raises(errors.BadArgument) as caught:
        RevertConfig().validate({"unit": "demo.service", "path": path})
    assert caught.value.fields["parameter"] == "path"


def test_the_path_is_required() -> None:
    with pytest.raises(errors.BadArgument) as caught:
        RevertConfig().validate({"unit": "demo.service"})
    assert caught.value.fields["parameter"] == "path"


def test_read_file_reads_a_root_owned_regular_file(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a root-owned file")
    (tmp_path / "demo.env").write_text(GOOD)
    (tmp_path / "demo.env").chmod(0o640)
    entry = read_file(str(tmp_path / "demo.env"))
    assert (entry["name"], entry["mode"], entry["uid"], entry["gid"]) == (
        "demo.env", 0o640, 0, 0)
    assert dropins.text_of(entry) == GOOD


def test_read_file_refuses_symlinks_other_types_and_missing_files(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "demo.env").write_text(GOOD)
    (tmp_path / "link.env").symlink_to(real / "demo.env")
    (tmp_path / "linkdir").symlink_to(real)
    cases = {
        str(tmp_path / "link.env"): "symlink",
        str(tmp_path / "linkdir" / "demo.env"): "symlink",
        str(real): "not a regular file",
        str(real / "absent.env"): "does not exist",
        str(tmp_path / "nowhere" / "demo.env"): "does not exist",
    }
    for path, reason in cases.items():
        with pytest.raises(BadPath, match=reason):
            read_file(path)


def test_read_file_refuses_a_file_it_could_not_give_back_its_owner(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    (tmp_path / "demo.env").write_text(GOOD)
    os.chown(tmp_path / "demo.env", 0, 1000)
    with pytest.raises(BadPath, match="owned by 0:1000"):
        read_file(str(tmp_path / "demo.env"))


def test_previous_is_the_content_before_the_latest_change_with_mode_and_owner() -> None:
    current = dropins.file_entry("demo.env", BROKEN, {"mode": 0o640, "uid": 0, "gid": 0})
    history = [change("modified", unified("PORT=80\n", GOOD), at=1_000_000),
               change("modified", unified(GOOD, BROKEN), at=10_000_000)]
    target = previous(current, history)
    assert target is not None
    assert dropins.text_of(target) == GOOD
    assert (target["mode"], target["uid"], target["gid"]) == (0o640, 0, 0)


def test_previous_is_none_when_contextd_has_no_exact_before_image() -> None:
    current = dropins.file_entry("demo.env", BROKEN)
    cut = unified(GOOD, BROKEN).splitlines(keepends=True)[:3]
    cases: list[list[Change]] = [
        [],                                                   # no history at all
        [change("modified", None)],                           # no diff stored
        [change("modified", "".join(cut) + "… diff cut at 10 bytes\n")],  # a cut diff
        [change("created", unified("", BROKEN))],             # nothing was there before
        [change("mode", None)],                               # a mode change
        [change("modified", unified("A=1\n", "A=2\n"))],      # does not fit the current text
    ]
    for history in cases:
        assert previous(current, history) is None, history


class FakeAudit:
    async def interrupted(self, directory: str) -> None:
        return None


class FakeContext:
    def __init__(self, history: list[Change] | None) -> None:
        self.config = Config()
        self.audit = FakeAudit()
        self._history = history

    def layers(self) -> None:
        return None

    async def unit_state(self, unit: str) -> Any:
        return SimpleNamespace(active_state="failed", result="exit-code")

    async def file_history(self, path: str) -> list[Change] | None:
        return self._history


def prepare(path: Path, history: list[Change] | None) -> Any:
    tool = RevertConfig()
    args = {"unit": "demo.service", "path": str(path)}
    return asyncio.run(tool.prepare(args, FakeContext(history)))  # type: ignore[arg-type]


def test_prepare_refuses_a_path_contextd_recorded_no_exact_change_of(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a root-owned file")
    (tmp_path / "demo.env").write_text(BROKEN)
    for history in ([], [change("modified", None)]):
        with pytest.raises(errors.BadArgument) as caught:
            prepare(tmp_path / "demo.env", history)
        assert caught.value.fields["parameter"] == "path"
        assert "contextd" in str(caught.value.fields["reason"])
    with pytest.raises(errors.NoPrevious):
        prepare(tmp_path / "demo.env", None)


def test_prepare_refuses_a_symlink_naming_the_parameter(tmp_path: Path) -> None:
    (tmp_path / "real.env").write_text(BROKEN)
    (tmp_path / "demo.env").symlink_to(tmp_path / "real.env")
    with pytest.raises(errors.BadArgument) as caught:
        prepare(tmp_path / "demo.env", [])
    assert caught.value.fields["parameter"] == "path"
    assert "symlink" in str(caught.value.fields["reason"])


def test_the_plan_shows_the_diff_it_would_write(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a root-owned file")
    path = tmp_path / "demo.env"
    path.write_text(BROKEN)
    plan = prepare(path, [change("modified", unified(GOOD, BROKEN))])
    assert dropins.text_of(plan.data["target"]) == GOOD
    assert "-MODE=broken\n+MODE=fine\n" in plan.data["diff"]
    assert any("+MODE=fine" in step for step in plan.steps), plan.steps
    assert path.read_text() == BROKEN, "prepare changed the file"
