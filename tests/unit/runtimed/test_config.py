"""runtimed.toml: defaults, the layout and keep-alive keys, refusals."""

from pathlib import Path

import pytest

from syntrop.config import ConfigError
from syntrop.runtimed.config import Config, load


def test_defaults_when_absent(tmp_path: Path) -> None:
    config = load(tmp_path)
    assert config == Config()
    assert (config.layout, config.keep_alive, config.spill_ram) == ("auto", 300.0, 256 << 20)
    assert (config.unload_pressure, config.pressure_file) == (25.0, "/proc/pressure/memory")


def test_values_are_read(tmp_path: Path) -> None:
    (tmp_path / "runtimed.toml").write_text(
        '[runtimed]\nslots = 2\nlayout = "instances"\ninstances = 2\nkeep_alive = 0.5\n'
        'spill_ram = 0\nunload_pressure = 40\npressure_file = "/sys/fs/cgroup/x/memory.pressure"\n')
    config = load(tmp_path)
    assert (config.slots, config.layout, config.instances) == (2, "instances", 2)
    assert (config.keep_alive, config.spill_ram) == (0.5, 0)
    assert config.unload_pressure == 40.0
    assert config.pressure_file == "/sys/fs/cgroup/x/memory.pressure"


@pytest.mark.parametrize("line", ['layout = "batches"', "keep_alive = -1", "spill_ram = -5",
                                  "instances = -1", "unload_pressure = 150",
                                  "unload_pressure = -1", 'slots = "8"', "keep_alive = true",
                                  "slots = 0", "crash_window = 0"])
def test_bad_values_are_refused_naming_file_and_key(tmp_path: Path, line: str) -> None:
    (tmp_path / "runtimed.toml").write_text(f"[runtimed]\n{line}\n")
    with pytest.raises(ConfigError) as refused:
        load(tmp_path)
    key = line.split(" = ")[0]
    assert str(tmp_path / "runtimed.toml") in str(refused.value)
    assert f"[runtimed]: {key} must be" in str(refused.value)
