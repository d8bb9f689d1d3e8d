"""Every daemon's configuration loader, fed the same bad files: each is
refused with a ConfigError that names the file and, for a bad value, the
key and what was expected; never a bare traceback."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from syntrop.config import ConfigError, Paths


def _paths(directory: Path) -> Paths:
    return Paths(runtime=directory, state=directory, cache=directory, configuration=directory)


def _loaders() -> dict[str, tuple[str, Callable[[Path], Any], str, str]]:
    """daemon -> (file, load(directory), table, a numeric key in it)."""
    from syntrop.contextd import config as contextd
    from syntrop.inferenced import config as inferenced
    from syntrop.modeld import config as modeld
    from syntrop.routerd import config as routerd
    from syntrop.runtimed import config as runtimed
    from syntrop.sentry import config as sentry
    from syntrop.toold import config as toold

    return {
        "inferenced": ("inferenced.toml", lambda d: inferenced.load(d / "inferenced.toml"),
                       "pressure", "memory_elevated"),
        "modeld": ("modeld.toml", lambda d: modeld.load(_paths(d)), "store", "budget_bytes"),
        "runtimed": ("runtimed.toml", runtimed.load, "runtimed", "slots"),
        "contextd": ("contextd.toml", lambda d: contextd.load(str(d / "contextd.toml")),
                     "timeline", "ring_size"),
        "toold": ("toold.toml", lambda d: toold.load(d / "toold.toml"), "rate", "per_unit"),
        "sentry": ("sentry.toml", sentry.load, "breaker", "cap"),
        "routerd": ("routerd.toml", lambda d: routerd.load(d / "routerd.toml"), "routing",
                    "deadline"),
    }


DAEMONS = ("inferenced", "modeld", "runtimed", "contextd", "toold", "sentry", "routerd")
#: The bad files: (name, contents given the table and key), and whether the
#: message must name the key.
BAD: dict[str, tuple[Callable[[str, str], str], bool]] = {
    "syntax": (lambda table, key: f"[{table}\n{key} = 1\n", False),
    "string for a number": (lambda table, key: f'[{table}]\n{key} = "8"\n', True),
    "boolean for a number": (lambda table, key: f"[{table}]\n{key} = true\n", True),
    "negative": (lambda table, key: f"[{table}]\n{key} = -3\n", True),
    "a value where a table goes": (lambda table, key: f"{table} = 3\n", True),
}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("daemon", DAEMONS)
def test_a_bad_file_is_refused_naming_file_and_key(tmp_path: Path, daemon: str,
                                                   bad: str) -> None:
    name, load, table, key = _loaders()[daemon]
    contents, names_key = BAD[bad]
    (tmp_path / name).write_text(contents(table, key))
    with pytest.raises(ConfigError) as refused:
        load(tmp_path)
    message = str(refused.value)
    assert str(tmp_path / name) in message, message
    if bad == "syntax":
        assert "line" in message, message
    elif bad == "a value where a table goes":
        assert table in message, message
    elif names_key:
        assert key in message and "must be" in message, message


@pytest.mark.parametrize("daemon", DAEMONS)
def test_an_absent_file_is_the_defaults(tmp_path: Path, daemon: str) -> None:
    _, load, _, _ = _loaders()[daemon]
    assert load(tmp_path) is not None
