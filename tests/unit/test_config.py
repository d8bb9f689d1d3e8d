"""Directories come from systemd's variables."""

from pathlib import Path

import pytest

from syntrop.config import Paths


def test_defaults_without_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("RUNTIME_DIRECTORY", "STATE_DIRECTORY", "CACHE_DIRECTORY",
                     "CONFIGURATION_DIRECTORY"):
        monkeypatch.delenv(variable, raising=False)
    paths = Paths.from_environment()
    assert paths.runtime == Path("/run/syntrop")
    assert paths.state == Path("/var/lib/syntrop")
    assert paths.socket("io.syntrop.Model1") == Path("/run/syntrop/io.syntrop.Model1")


def test_first_of_several_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/syntrop/models:/var/lib/other")
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/tmp/x/run")
    paths = Paths.from_environment()
    assert paths.state == Path("/var/lib/syntrop/models")
    assert paths.socket("io.syntrop.Tool1") == Path("/tmp/x/run/io.syntrop.Tool1")
