"""contextd.toml validation."""

from pathlib import Path

import pytest

from syntrop.config import ConfigError
from syntrop.contextd.config import DAY, Config, load, parse


def test_defaults() -> None:
    config = parse({})
    assert config == Config()
    assert "/etc/systemd/system" in config.unit_dirs
    assert config.journal.journalctl == "journalctl" and config.kernel


def test_values(tmp_path: Path) -> None:
    path = tmp_path / "contextd.toml"
    path.write_text('unit_dirs = ["/u"]\nexit_on_idle = true\n[timeline]\nring_size = 10\n'
                    'retention_days = 2\n[journal]\nfiles = ["/j/a.journal"]\njournalctl = ""\n'
                    '[packages]\ndnf_log = ""\n')
    config = load(str(path))
    assert config.unit_dirs == ("/u",) and config.exit_on_idle and config.ring_size == 10
    assert config.retention_usec == 2 * DAY and config.dnf_log is None
    assert config.journal.files == ("/j/a.journal",) and not config.kernel


@pytest.mark.parametrize("data", [
    {"unit_dirs": "/etc"}, {"unit_dirs": [1]}, {"timeline": {"ring_size": 0}},
    {"timeline": {"flood_rate": -1}}, {"timeline": []}, {"exit_on_idle": "yes"},
    {"journal": {"kernel": 1}}, {"journal": {"journalctl": 5}},
    {"files": {"max_diff_bytes": 10}}, {"timeline": {"ring_size": True}},
])
def test_bad_values_say_where(data: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"contextd\.toml"):
        parse(data)


def test_unparsable_file(tmp_path: Path) -> None:
    path = tmp_path / "contextd.toml"
    path.write_text("[[[")
    with pytest.raises(ConfigError):
        load(str(path))
