from pathlib import Path

import pytest

from syntrop.config import ConfigError
from syntrop.toold.config import DEFAULT_DENY, load, parse


def test_defaults_deny_pid1s_critical_units_and_syntrop() -> None:
    config = parse({})
    assert config.unit_dirs == (Path("/etc/systemd/system"), Path("/run/systemd/system"))
    assert "dbus.service" in config.deny and "toold.*" in config.deny
    assert config.deny == DEFAULT_DENY and config.sentry_uid is None
    assert not config.allow_weaker


def test_everything_comes_from_the_file(tmp_path: Path) -> None:
    (tmp_path / "toold.toml").write_text(
        'unit_dirs = ["/x/etc"]\ncache_root = "/x/cache"\nsentry_uid = 990\ndeny = []\n'
        '[rate]\nper_unit = 1\nper_unit_window_sec = 5\n[sandbox]\nallow_weaker = true\n'
        'bwrap = "/opt/bwrap"\n[timeouts]\nhealth_window_sec = 0\n'
        '[free_space]\njournal_dirs = ["/x/journal"]\njournal_keep_mib = 8\n'
        '[downgrade_package]\narchives = "/x/debs"\nstatus = "/x/status"\n')
    config = load(tmp_path / "toold.toml")
    assert config.unit_dirs == (Path("/x/etc"),) and config.cache_root == Path("/x/cache")
    assert config.sentry_uid == 990 and config.deny == ()
    assert config.rate.per_unit == 1 and config.rate.per_unit_window == 5
    assert config.allow_weaker and config.bwrap == "/opt/bwrap" and config.health_window == 0
    assert config.journal_dirs == (Path("/x/journal"),) and config.journal_keep == 8 << 20
    assert config.archives == Path("/x/debs") and config.dpkg_status == Path("/x/status")


@pytest.mark.parametrize("data", [
    {"unit_dirs": "relative"}, {"unit_dirs": ["relative"]}, {"sentry_uid": -1},
    {"sentry_uid": True}, {"rate": {"per_unit": 0}}, {"sandbox": {"allow_weaker": "yes"}},
    {"allow": "*.service"}, {"cache_root": "var/cache"},
    {"free_space": {"journal_keep_mib": 0}}, {"free_space": {"journal_keep_mib": "8"}},
    {"free_space": {"journal_dirs": "/var/log/journal"}}, {"free_space": []},
    {"downgrade_package": {"archives": "var/cache/apt/archives"}}, {"downgrade_package": []},
])
def test_bad_config_is_refused_with_where(data: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"toold\.toml"):
        parse(data)
