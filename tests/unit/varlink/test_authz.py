"""The authorization rule, as pure logic: polkit's answer is faked here;
tests/system/test_authorization.py asks a real polkitd."""

import asyncio
import os
from collections.abc import Iterator

import pytest

from syntrop.varlink import authz
from syntrop.varlink.peer import Peer, reset_current, set_current

NotAuthorized = authz.not_authorized("io.syntrop.Test1")


@pytest.fixture
def polkit(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """polkit grants io.syntrop.sentry.triage to uid 4242 only; records each question."""
    asked: list[tuple[str, int]] = []

    async def check(action: str, peer: Peer) -> bool:
        asked.append((action, peer.uid))
        return action == authz.TRIAGE and peer.uid == 4242

    monkeypatch.setattr(authz.checker, "check", check)
    yield asked


def call_as(uid: int, action: str, owner_uid: int | None = None,
            allow: tuple[str, ...] = ()) -> str:
    async def run() -> str:
        token = set_current(Peer(pid=os.getpid(), uid=uid, gid=uid))
        try:
            await authz.authorize(action, NotAuthorized, owner_uid=owner_uid, allow=allow)
            return "allowed"
        except NotAuthorized as error:
            return f"refused {error.parameters['action']}"
        finally:
            reset_current(token)
    return asyncio.run(run())


@pytest.mark.parametrize(("uid", "action", "owner", "expected", "asks"), [
    (0, authz.TRIAGE, None, "allowed", False),
    (os.geteuid(), authz.EMERGENCY, None, "allowed", False),
    (4343, authz.LEASE_OTHERS, 4343, "allowed", False),
    (4242, authz.TRIAGE, None, "allowed", True),
    (4242, authz.EMERGENCY, None, f"refused {authz.EMERGENCY}", True),
    (4343, authz.TRIAGE, 4242, f"refused {authz.TRIAGE}", True),
])
def test_root_self_and_owner_pass_others_ask_polkit(
        polkit: list[tuple[str, int]], uid: int, action: str, owner: int | None,
        expected: str, asks: bool) -> None:
    if uid == 4242 and os.geteuid() == 4242:
        pytest.skip("runs as the uid the test grants")
    assert call_as(uid, action, owner) == expected
    assert polkit == ([(action, uid)] if asks else [])


ROUTER_UID, RUNTIME_UID, MODEL_UID = 4501, 4502, 4503


@pytest.fixture
def accounts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The daemon accounts as scripts/install makes them, faked; this
    process runs as runtimed's (production: not dev mode)."""
    uids = {authz.ROUTER_USER: ROUTER_UID, authz.RUNTIME_USER: RUNTIME_UID,
            authz.MODEL_USER: MODEL_UID}
    monkeypatch.setattr(authz, "uid_of", uids.get)
    monkeypatch.setattr(os, "geteuid", lambda: RUNTIME_UID)
    yield


def peer(uid: int) -> Peer:
    return Peer(pid=4000, uid=uid, gid=uid)


@pytest.mark.parametrize(("uid", "allow", "expected"), [
    (0, (), True),                                       # root always
    (0, (authz.ROUTER_USER,), True),
    (ROUTER_UID, (authz.ROUTER_USER,), True),            # the daemon the method names
    (ROUTER_UID, (), False),                             # a daemon the method does not name
    (MODEL_UID, (authz.ROUTER_USER,), False),
    (RUNTIME_UID, (), False),                            # this daemon's own uid, not listed
    (RUNTIME_UID, (authz.ROUTER_USER,), False),
    (4242, (authz.ROUTER_USER,), False),                 # a stranger
    (-1, (), False),                                     # no credentials
])
def test_root_and_the_listed_daemon_pass_nobody_else(
        accounts: None, uid: int, allow: tuple[str, ...], expected: bool) -> None:
    assert authz.privileged(peer(uid), allow=allow) is expected


def test_the_owner_passes_and_a_daemon_reaches_no_one_elses_thing(accounts: None) -> None:
    assert authz.privileged(peer(4242), owner_uid=4242)
    assert not authz.privileged(peer(ROUTER_UID), owner_uid=4242)
    assert not authz.privileged(peer(RUNTIME_UID), owner_uid=4242)


def test_an_account_that_does_not_exist_lets_nobody_through(accounts: None) -> None:
    assert not authz.privileged(peer(4242), allow=("syntrop-no-such-account",))


def test_dev_mode_a_daemon_run_as_a_user_lets_that_user_through(
        monkeypatch: pytest.MonkeyPatch, accounts: None) -> None:
    """`syn up` runs every daemon as the user who started it: that user is
    the caller too, and no daemon account is involved."""
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    assert authz.privileged(peer(4242))
    assert not authz.privileged(peer(4343))


def test_a_daemon_refuses_another_daemon_it_does_not_name(
        polkit: list[tuple[str, int]], accounts: None) -> None:
    """routerd's uid calling a method that names no daemon is anybody:
    polkit is asked (and the shipped rule grants the daemon accounts
    nothing); runtimed calling a method naming it is let through unasked."""
    assert call_as(ROUTER_UID, authz.MANAGE_MODELS) == f"refused {authz.MANAGE_MODELS}"
    assert call_as(RUNTIME_UID, authz.MANAGE_RUNTIME) == f"refused {authz.MANAGE_RUNTIME}"
    assert call_as(ROUTER_UID, authz.MANAGE_RUNTIME,
                   allow=(authz.ROUTER_USER,)) == "allowed"
    assert polkit == [(authz.MANAGE_MODELS, ROUTER_UID), (authz.MANAGE_RUNTIME, RUNTIME_UID)]


def test_uid_of_resolves_real_accounts_and_none_for_missing() -> None:
    assert authz.uid_of("root") == 0
    assert authz.uid_of("syntrop-no-such-account") is None


def test_the_operator_rule_leaves_out_every_daemon_account() -> None:
    from pathlib import Path

    rules = (Path(__file__).resolve().parents[3] / "polkit" / "50-syntrop.rules").read_text()
    for account in authz.DAEMON_ACCOUNTS:
        assert f'"{account}"' in rules, account


def test_no_polkit_is_a_refusal_never_permission(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real checker, pointed at a bus where nobody answers."""
    from syntrop.system.polkit import Authority

    fresh = authz._Checker()
    fresh._authority = Authority(address="unix:path=/nonexistent/syntrop-test-bus")
    monkeypatch.setattr(authz, "checker", fresh)
    assert call_as(4242, authz.TRIAGE) == f"refused {authz.TRIAGE}"


def test_a_caller_without_a_pid_is_refused_without_asking(
        polkit: list[tuple[str, int]]) -> None:
    async def run() -> bool:
        token = set_current(Peer(pid=0, uid=4242, gid=4242))
        try:
            return await authz._Checker().check(authz.TRIAGE, Peer(pid=0, uid=4242, gid=4242))
        finally:
            reset_current(token)
    assert asyncio.run(run()) is False


def test_every_action_is_declared_and_the_operator_rule_names_only_declared_ones() -> None:
    """polkit refuses an action its policy does not declare, whatever the
    rules say: each action the daemons ask about is in io.syntrop.policy,
    and 50-syntrop.rules grants only declared ones."""
    import re
    import xml.etree.ElementTree as ET
    from pathlib import Path

    polkit = Path(__file__).resolve().parents[3] / "polkit"
    declared = {a.get("id") for a in ET.parse(polkit / "io.syntrop.policy").iter("action")}
    asked = {value for name, value in vars(authz).items()
             if name.isupper() and isinstance(value, str) and value.startswith("io.syntrop.")}
    assert asked and asked <= declared, asked - declared
    rules = (polkit / "50-syntrop.rules").read_text()
    granted = set(re.findall(r"\"(io\.syntrop\.[a-z.-]+)\"", rules))
    assert granted and granted <= declared, granted - declared
