"""syn's model commands: sizes, one-line errors."""

import argparse

import pytest

from syntrop.cli.modelclient import describe, human, parse_size
from syntrop.interfaces import model as contract
from syntrop.varlink import InvalidParameter


def test_parse_size() -> None:
    assert parse_size("1024") == 1024
    assert parse_size("500M") == 500 << 20
    assert parse_size("2.5G") == int(2.5 * (1 << 30))
    assert parse_size("10GiB") == 10 << 30
    assert parse_size("1k") == 1024
    for bad in ("", "G", "-1", "1X", "1.2.3"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)


def test_human() -> None:
    assert human(None) == "?"
    assert human(512) == "512 B"
    assert human(98_362_432) == "93.8 MiB"


@pytest.mark.parametrize("error, words", [
    (contract.InvalidIdentifier(identifier="a/b"), "invalid model name 'a/b'"),
    (contract.ModelNotFound(name="x:latest"), "no model named x:latest"),
    (contract.DigestMismatch(expected="a" * 64, actual="b" * 64), "nothing was stored"),
    (contract.StoreFull(required=2 << 30, available=1 << 30), "2.0 GiB needed, 1.0 GiB free"),
    (contract.ModelInUse(name="m:t"), "m:t is in use"),
    (contract.InvalidReference(reference="ftp://x", reason="unknown"), "ftp://x: unknown"),
    (contract.PullFailed(reference="hf://o/r/f", status=0, reason="cut"), "hf://o/r/f: cut"),
    (contract.InvalidModel(reason="not a GGUF"), "not a model file: not a GGUF"),
    (contract.NotAuthorized(action="io.syntrop.model.manage"),
     "not authorized (io.syntrop.model.manage)"),
    (InvalidParameter(parameter="fd"), "'fd'"),
])
def test_every_declared_error_reads_as_one_line(error: BaseException, words: str) -> None:
    line = describe(error)
    assert words in line and "\n" not in line


def test_every_error_of_the_contract_has_its_own_line() -> None:
    for error in contract.Model1.errors:
        fields = error.Parameters.__annotations__  # type: ignore[attr-defined]
        instance = error(**{name: ("x" if kind is str else 1) for name, kind in fields.items()})
        assert not describe(instance).startswith("modeld answered"), error.name
    assert describe(Exception()).startswith("modeld answered")
