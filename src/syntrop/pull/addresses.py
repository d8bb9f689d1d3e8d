"""Which hosts a pull may reach: global addresses only, unless configured.

A reference or a redirect can name any host, and `syn pull` runs on the
machine whose loopback services, link-local metadata endpoint and private
network it would otherwise reach on the puller's behalf. So every request
of a pull (each redirect hop too) resolves its host first and is refused,
before any connection, when one of the addresses is not global: loopback,
link-local, private, unique-local, shared, multicast, unspecified,
reserved, and those same IPv4 addresses written as IPv6. `[network]` of
pull.toml (allow, allow_private) or $SYNTROP_PULL_ALLOW opens networks for
a registry on a private network.
"""

import ipaddress
import socket
from collections.abc import Callable, Sequence

import httpx

from syntrop.pull.registries.base import RegistryError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: IPv6 prefixes that carry an IPv4 address in their last 32 bits
#: (IPv4-compatible, the well-known NAT64 prefix).
_CARRIERS = (ipaddress.IPv6Network("::/96"), ipaddress.IPv6Network("64:ff9b::/96"))

#: What the refusal tells the user to change.
SETTING = "[network] allow (CIDRs) or allow_private = true in pull.toml, or $SYNTROP_PULL_ALLOW"


class Refused(RegistryError):
    """A pull named a host that resolves to a non-global address."""


def _as_ipv4(address: Address) -> Address:
    """The IPv4 address an IPv6 address stands for, if it stands for one."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if any(address in carrier for carrier in _CARRIERS):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def refused(address: Address, allowed: Sequence[Network] = ()) -> bool:
    """Whether a pull must not connect to `address`: it is not a global
    unicast address and no network in `allowed` holds it."""
    if any(address in network for network in allowed):
        return False
    address = _as_ipv4(address)
    if any(address in network for network in allowed):
        return False
    return not address.is_global or address.is_multicast or address.is_unspecified


def check(host: str, allowed: Sequence[Network] = ()) -> None:
    """Resolve `host` (a name or an address) and raise Refused if any of
    its addresses is refused; a host that does not resolve is not reached
    either (retryable: the name service may be down)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise RegistryError(f"{host}: cannot resolve the host ({error})", retryable=True) from None
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if refused(address, allowed):
            name = host if host == str(address) else f"{host} ({address})"
            raise Refused(f"{name}: refused, not a global address; to pull from it, "
                          f"allow it with {SETTING}")


def guard(allowed: Sequence[Network] = ()) -> Callable[[httpx.Request], None]:
    """An httpx request hook: runs before each request a client sends,
    redirects included, and refuses one whose host is refused."""
    networks = tuple(allowed)

    def hook(request: httpx.Request) -> None:
        check(request.url.host, networks)

    return hook
