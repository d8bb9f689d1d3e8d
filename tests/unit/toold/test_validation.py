"""Unit names and tool parameter schemas: bad input is refused by name."""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syntrop.toold import errors, units
from syntrop.toold.tools import TOOL_TYPES


@pytest.mark.parametrize("name", [
    "../x.service", "/etc/passwd", "foo.service/../../etc", "a/b.service", "..service",
    "x", "x.unknown", ".hidden.service", "-x.service", "a\0.service", "", "a" * 300 + ".service",
    "foo..service",
])
def test_bad_unit_names_are_refused(name: str) -> None:
    assert units.syntax_error(name) is not None


@pytest.mark.parametrize("name", ["nginx.service", "getty@tty1.service", "a-b_c:d.socket",
                                  "foo@.service", "x\\x2dy.mount"])
def test_good_unit_names_pass(name: str) -> None:
    assert units.syntax_error(name) is None


@given(st.text(max_size=40))
def test_an_accepted_name_never_climbs(name: str) -> None:
    if units.syntax_error(name) is None:
        assert "/" not in name and ".." not in name and name[0] not in ".-"


def test_allow_and_deny_patterns() -> None:
    allow, deny = ("*.service",), ("dbus.*", "syntrop-*")
    assert units.allowed("nginx.service", allow, deny)
    assert not units.allowed("dbus.service", allow, deny)
    assert not units.allowed("syntrop-x.service", allow, deny)
    assert not units.allowed("nginx.socket", allow, deny)


def bad(tool: str, parameters: Any) -> tuple[str, str]:
    with pytest.raises(errors.BadArgument) as caught:
        TOOL_TYPES[tool]().validate(parameters)
    return caught.value.fields["parameter"], caught.value.fields["reason"]  # type: ignore[return-value]


def test_schema_refuses_unknown_missing_and_mistyped_parameters() -> None:
    assert bad("unit_restart", {"unit": "a.service", "extra": 1}) == ("extra", "unknown parameter")
    assert bad("unit_restart", {}) == ("unit", "required")
    assert bad("unit_restart", {"unit": 5})[0] == "unit"
    assert bad("unit_restart", {"unit": "a.service", "timeout_sec": True})[1] == \
        "must be int, not bool"
    assert bad("unit_restart", {"unit": "a.service", "timeout_sec": 0})[1] == "must be at least 1"
    assert bad("revert_dropin", {"unit": "a.service", "scope": "elsewhere"})[0] == "scope"
    assert bad("daemon_reload", {"unit": "a.service"}) == ("unit", "unknown parameter")
    assert bad("daemon_reload", ["not", "an", "object"])[0] == "parameters"


def test_schema_passes_good_parameters() -> None:
    assert TOOL_TYPES["unit_restart"]().validate({"unit": "a.service", "timeout_sec": 5}) == {
        "unit": "a.service", "timeout_sec": 5}
    assert TOOL_TYPES["daemon_reload"]().validate(None) == {}
