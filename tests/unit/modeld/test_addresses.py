"""syntrop.pull.addresses: which hosts a pull may reach, checked per
request (each redirect hop) before it connects. Traffic stays on loopback."""

import ipaddress
from pathlib import Path

import httpx
import pytest

from syntrop.config import ConfigError
from syntrop.pull.addresses import Refused, check, guard, refused
from syntrop.pull.registries import RegistryError, Settings
from tests.security.loopback import serving

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)


@pytest.mark.parametrize("address", [
    "0.0.0.0", "0.1.2.3", "100.64.0.1", "224.0.0.1", "239.255.255.250", "255.255.255.255",
    "::", "ff02::1", "::ffff:10.0.0.1", "::ffff:0.0.0.0", "64:ff9b::a9fe:a9fe", "::7f00:1",
])
def test_other_non_global_addresses_are_refused(address: str) -> None:
    assert refused(ipaddress.ip_address(address))


def test_an_allowed_network_opens_its_addresses_and_their_ipv6_forms() -> None:
    assert not refused(ipaddress.ip_address("127.0.0.1"), LOOPBACK)
    assert not refused(ipaddress.ip_address("::ffff:127.0.0.1"), LOOPBACK)
    assert refused(ipaddress.ip_address("127.0.0.2"), LOOPBACK)
    assert refused(ipaddress.ip_address("::1"), LOOPBACK)


def test_a_name_is_judged_by_what_it_resolves_to() -> None:
    with pytest.raises(Refused, match=r"^localhost \((127\.0\.0\.1|::1)\): refused.*pull\.toml"):
        check("localhost")
    with pytest.raises(RegistryError, match="cannot resolve") as error:
        check("a..b")  # fails in the resolver's input, before any query
    assert error.value.retryable


def test_each_redirect_hop_is_checked_before_it_connects() -> None:
    """127.0.0.1 is allowed, 127.0.0.2 is not: the redirect to it is
    refused, and nothing listens there to tell otherwise."""
    with serving(lambda _: (302, {"location": "http://127.0.0.2:9/m"}, b"")) as server, \
            httpx.Client(event_hooks={"request": [guard(LOOPBACK)]}) as client:
        with pytest.raises(Refused, match=r"^127\.0\.0\.2: refused"):
            client.get(server.url("/m"), follow_redirects=True)
        assert server.requests == ["GET /m"]
    with serving(lambda _: (200, {}, b"")) as server, \
            httpx.Client(event_hooks={"request": [guard()]}) as client:
        with pytest.raises(Refused):
            client.get(server.url("/m"))
        assert server.requests == []


def test_the_settings_read_allowed_networks(tmp_path: Path) -> None:
    (tmp_path / "pull.toml").write_text('[network]\nallow = ["10.1.0.0/16", "fd00::/8"]\n')
    settings = Settings.load(tmp_path, {"SYNTROP_PULL_ALLOW": "127.0.0.0/8, ::1"})
    assert [str(n) for n in settings.allowed] == ["10.1.0.0/16", "fd00::/8", "127.0.0.0/8",
                                                  "::1/128"]
    assert Settings.load(tmp_path / "none", {}).allowed == ()
    (tmp_path / "pull.toml").write_text("[network]\nallow_private = true\n")
    assert not refused(ipaddress.ip_address("169.254.169.254"),
                       Settings.load(tmp_path, {}).allowed)
    for bad in ('allow = "10.0.0.0/8"', 'allow = ["10.0.0.0/33"]', "allow_private = 1"):
        (tmp_path / "pull.toml").write_text(f"[network]\n{bad}\n")
        with pytest.raises(ConfigError, match="network"):
            Settings.load(tmp_path, {})
