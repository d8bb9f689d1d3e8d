"""sentry.toml: the budgets (gang and decide included) and sysfs_root."""

from pathlib import Path

import pytest

from syntrop.config import ConfigError
from syntrop.sentry.config import parse


def test_defaults() -> None:
    config = parse({})
    assert config.budgets.decide_usec == 1_800_000
    assert config.budgets.gang_usec == 1_000_000
    assert config.sysfs_root == Path("/")


def test_budgets_and_sysfs_root() -> None:
    config = parse({"sysfs_root": "/srv/fake", "budgets": {"gang": 250, "decide": 20}})
    assert (config.budgets.gang_usec, config.budgets.decide_usec) == (250_000, 20_000)
    assert config.sysfs_root == Path("/srv/fake")


@pytest.mark.parametrize("data", [
    {"sysfs_root": "relative/sys"}, {"sysfs_root": 3}, {"budgets": {"gang": -1}},
    {"budgets": {"decide": "fast"}}, {"budgets": {"decide": True}},
])
def test_bad_values_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        parse(data)
