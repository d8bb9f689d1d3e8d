"""downgrade_package's pure parts: Debian's version ordering (checked
against dpkg itself where it is installed), what dpkg's status says is
installed, the .deb chosen from a cache directory, and its refusals."""

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from syntrop.system.debian import compare, split
from syntrop.toold import errors
from syntrop.toold.config import Config
from syntrop.toold.tools import TOOL_TYPES
from syntrop.toold.tools.downgrade_package import (
    Deb,
    DowngradePackage,
    cached,
    installed,
    previous,
    same,
    transient_name,
)

ORDERED = ["1.0~rc1", "1.0", "1.0-0.1", "1.0-1", "1.0-1+b1", "1.0a", "1.0+dfsg", "1.00.1",
           "1.1~~", "1.1~", "1.1", "1.2", "1.10", "2:0.1", "2:0.1-1"]


def test_versions_order_as_debian_orders_them() -> None:
    for i, low in enumerate(ORDERED):
        for high in ORDERED[i + 1:]:
            assert compare(low, high) == -1, (low, high)
            assert compare(high, low) == 1, (high, low)
        assert compare(low, low) == 0
    assert compare("1.0", "1.0-0") == 0 and compare("01.0", "1.0") == 0
    assert compare("1:1.0", "2.0") == 1  # the epoch first
    assert split("2:1.0-3-4") == (2, "1.0-3", "4") and split("1.0") == (0, "1.0", "")
    for bad in ("abc", "1.0-", "1:", "a:1.0", "1.0 beta", ""):
        with pytest.raises(ValueError):
            compare(bad, "1.0")


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg is not installed")
def test_the_ordering_is_dpkg_s() -> None:
    pairs = [("1.0~rc1", "1.0"), ("1.0-1", "1.0a"), ("1.0+dfsg", "1.00.1"), ("1.1~~", "1.1~"),
             ("1:0.9", "2.0"), ("2.0-1ubuntu1", "2.0-1"), ("1.2.3", "1.2.3.0"), ("0.9", "0.10")]
    for a, b in pairs:
        said = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False).returncode
        assert (compare(a, b) < 0) == (said == 0), (a, b)


STATUS = """Package: pl-tool
Status: deinstall ok config-files
Version: 0.5

Package: pl-tool
Status: install ok installed
Priority: optional
Architecture: amd64
Version: 2.0
Description: a tool
 with a long description
 Version: 9.9

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""


def test_the_installed_version_is_the_stanza_installed_ok() -> None:
    found = installed(STATUS, "pl-tool")
    assert found is not None and (found.version, found.architecture) == ("2.0", "amd64")
    assert installed(STATUS, "gone") is None and installed(STATUS, "absent") is None


def fake_cache(root: Path, names: list[str]) -> str:
    for name in names:
        (root / name).write_bytes(b"!<arch>\n")
    (root / "partial").mkdir()
    (root / "pl-tool_0.9_amd64.deb.lock").write_bytes(b"")
    return str(root)


def test_the_previous_version_is_the_highest_lower_one_of_the_arch(tmp_path: Path) -> None:
    cache = fake_cache(tmp_path, [
        "pl-tool_1.0_amd64.deb", "pl-tool_1.5~rc1_all.deb", "pl-tool_1.9_arm64.deb",
        "pl-tool_2.0_amd64.deb", "pl-tool_3.0_amd64.deb", "pl-tool-extra_1.8_amd64.deb",
        "pl-tool_not-a-version_amd64.deb", "pl-tool_1%3a0.1_amd64.deb"])
    debs = cached(cache, "pl-tool", "amd64")
    assert sorted(d.version for d in debs) == ["1.0", "1.5~rc1", "1:0.1", "2.0", "3.0"]
    older = previous(debs, "2.0")
    assert older is not None and older.path.endswith("pl-tool_1.5~rc1_all.deb")
    current = same(debs, "2.0")
    assert current is not None and current.path.endswith("pl-tool_2.0_amd64.deb")
    # An epoch outranks every plain version.
    newest = previous(debs, "1:0.2")
    assert newest is not None and newest.version == "1:0.1"
    assert previous(debs, "1.0") is None and same(debs, "2.5") is None
    assert cached(str(tmp_path / "absent"), "pl-tool", "amd64") == []


def test_the_parameters_are_a_unit_and_a_package_name() -> None:
    tool = DowngradePackage()
    assert tool.validate({"unit": "web.service", "package": "libssl3t64"}) == {
        "unit": "web.service", "package": "libssl3t64"}
    for bad in ({"unit": "web.service"}, {"unit": "web.service", "package": "Bad"},
                {"unit": "web.service", "package": "pl-tool:amd64"},
                {"unit": "web.service", "package": "../x"},
                {"unit": "web.service", "package": "-x"},
                {"unit": "web.service", "package": "x"}):
        with pytest.raises(errors.BadArgument):
            tool.validate(bad)
    assert TOOL_TYPES["downgrade_package"] is DowngradePackage
    assert transient_name("g++-13").startswith("syntrop-downgrade-g__-13-")


class FakeState:
    active_state = "failed"


class FakeContext:
    def __init__(self, root: Path) -> None:
        self.config = Config(archives=root / "archives", dpkg_status=root / "status",
                             health_window=0)

    async def unit_state(self, unit: str) -> Any:
        return FakeState()


def prepare(root: Path, package: str) -> Any:
    return asyncio.run(DowngradePackage().prepare({"unit": "pl.service", "package": package},
                                                  FakeContext(root)))  # type: ignore[arg-type]


def test_refusals_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "status").write_text(STATUS)
    (tmp_path / "archives").mkdir()
    with pytest.raises(errors.BadArgument) as refused:
        prepare(tmp_path, "gone")
    assert refused.value.fields["reason"] == "not installed"
    with pytest.raises(errors.NoPrevious) as none:
        prepare(tmp_path, "pl-tool")
    assert none.value.fields == {"unit": "pl.service",
                                 "reason": "no previous version in the package cache"}
    (tmp_path / "archives" / "pl-tool_1.0_amd64.deb").write_bytes(b"!<arch>\n")
    (tmp_path / "archives" / "pl-tool_2.0_amd64.deb").write_bytes(b"!<arch>\n")
    fields = {"Package": "pl-tool", "Version": "1.1"}

    async def fake_fields(path: str) -> dict[str, str]:
        return fields

    monkeypatch.setattr("syntrop.toold.tools.downgrade_package.deb_fields", fake_fields)
    with pytest.raises(errors.BadArgument) as mismatch:
        prepare(tmp_path, "pl-tool")
    assert mismatch.value.fields["reason"] == "the .deb's control fields do not match its name"
    fields["Version"] = "1.0"
    plan = prepare(tmp_path, "pl-tool")
    assert plan.steps[0].startswith("install pl-tool 1.0 from ") and "(replacing 2.0)" in \
        plan.steps[0]
    assert plan.steps[1] == "call Manager.RestartUnit('pl.service') and wait for its job"
    assert plan.data["reversible"] is True and isinstance(plan.data["newer"], Deb)
    (tmp_path / "archives" / "pl-tool_2.0_amd64.deb").unlink()
    plan = prepare(tmp_path, "pl-tool")
    assert plan.data["reversible"] is False and "is not in" in plan.steps[-1]


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_a_deb_s_own_fields_are_read(tmp_path: Path) -> None:
    from syntrop.toold.tools.downgrade_package import deb_fields

    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: pl-tool\nVersion: 1:1.0-2\nArchitecture: all\nMaintainer: none <none@none>\n"
        "Description: a test\n")
    deb = tmp_path / "pl-tool_1%3a1.0-2_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(deb)], check=True,
                   capture_output=True)
    assert asyncio.run(deb_fields(str(deb))) == {"Package": "pl-tool", "Version": "1:1.0-2"}
    assert [d.version for d in cached(str(tmp_path), "pl-tool", "amd64")] == ["1:1.0-2"]
