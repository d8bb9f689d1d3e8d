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


def call_as(uid: int, action: str, owner_uid: int | None = None) -> str:
    async def run() -> str:
        token = set_current(Peer(pid=os.getpid(), uid=uid, gid=uid))
        try:
            await authz.authorize(action, NotAuthorized, owner_uid=owner_uid)
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
