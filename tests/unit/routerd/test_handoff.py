"""When the entry node hands a chat's prefill off (handoff.py's plan), and
what each provider is sent of it (body_for): pure logic over a real
Registry, runtimed's load a stand-in."""

import asyncio

from syntrop.config import Paths
from syntrop.routerd.config import Config, FleetConfig, ProviderConfig
from syntrop.routerd.handoff import HANDOFF, Handoff, body_for
from syntrop.routerd.providers import REGISTRY, Capabilities
from syntrop.routerd.providers.base import STATE
from syntrop.routerd.registry import Registry
from syntrop.routerd.scoring import Scored

LOCAL = ProviderConfig(id="local", kind="runtimed", tier="local", models=("m",))
MEMBER = ProviderConfig(id="fleet:b", kind="peer", endpoint="http://b:1/v1", tier="lan",
                        models=("m",))
FLEET = FleetConfig(etcd=("http://e:1",), node="a", advertise="http://a:1/v1",
                    handoff_tokens=1024)


class Load:
    """Stands in for runtimed's GetLoad."""

    capabilities = Capabilities(load=True, prefill=True)
    config = LOCAL

    def __init__(self, free: int) -> None:
        self.free = free

    async def load(self) -> dict[str, object]:
        return {"free_slots": self.free, "total_slots": 2, "models": []}


def registry(local_free: int, member_free: int) -> Registry:
    found = Registry(Config(listen=(), providers=(LOCAL,), fleet=FLEET),
                     Paths.from_environment())
    found.set_fleet((MEMBER,), caches=(("fleet:b", "m", [], 0, 2),),
                    free={"fleet:b": member_free})
    found.affinity.report("local", "m", [], 0, 2)
    found.providers["local"] = Load(local_free)  # type: ignore[assignment]
    return found


def scored(provider: str, prefix_chars: int = 0, throttled: bool = False) -> Scored:
    return Scored(provider, "m", 50.0, 50.0, 50.0, 50.0, False, throttled,
                  prefix_chars=prefix_chars)


def plan(local_free: int, member_free: int, order: tuple[str, str], tokens: int = 3000,
         prefix_chars: int = 0) -> tuple[str, str] | None:
    handoff = Handoff(registry(local_free, member_free))
    first, second = order
    found = asyncio.run(handoff.plan([scored(first, prefix_chars), scored(second)], tokens))
    return None if found is None else (found[0].provider, found[1].provider)


def test_a_long_prompt_for_a_busy_node_is_prefilled_on_an_idle_one() -> None:
    # The member is decoding (1 of 2 slots free), this node is idle.
    assert plan(2, 1, ("fleet:b", "local")) == ("fleet:b", "local")
    # This node is decoding, the member idle: the member prefills.
    assert plan(1, 2, ("local", "fleet:b")) == ("local", "fleet:b")


def test_no_hand_off_when_it_cannot_pay() -> None:
    assert plan(2, 1, ("fleet:b", "local"), tokens=900) is None  # short: prefill it there
    # Most of it is resident at the target already.
    assert plan(2, 1, ("fleet:b", "local"), prefix_chars=4 * 2500) is None
    assert plan(2, 2, ("fleet:b", "local")) is None  # the target idle: it is fastest
    assert plan(1, 1, ("fleet:b", "local")) is None  # nobody idle
    assert plan(2, 0, ("fleet:b", "local")) is None  # a full target: routing overflows


def test_off_without_a_fleet_or_with_handoff_tokens_zero() -> None:
    for fleet in (FleetConfig(), FleetConfig(etcd=("http://e:1",), node="a",
                                             advertise="http://a:1/v1", handoff_tokens=0)):
        found = Registry(Config(listen=(), providers=(LOCAL,), fleet=fleet),
                         Paths.from_environment())
        if fleet.etcd:
            found.set_fleet((MEMBER,), free={"fleet:b": 1})
        assert asyncio.run(Handoff(found).plan(
            [scored("fleet:b"), scored("local")], 3000)) is None


def test_each_provider_is_sent_only_its_part() -> None:
    found = registry(2, 1)
    body = {"model": "m", STATE: 7, HANDOFF: {"from": "a", "to": "fleet:b"}}
    runtimed = found.providers["local"]
    paths = Paths.from_environment()
    member = REGISTRY["peer"](MEMBER, paths)
    other = REGISTRY["peer"](ProviderConfig(id="fleet:c", kind="peer", endpoint="http://c:1/v1",
                                            tier="lan", models=("m",)), paths)
    remote = REGISTRY["openai"](ProviderConfig(id="r", kind="openai", endpoint="http://r/v1",
                                               tier="remote", models=("m",)), paths)
    assert body_for(runtimed, body) == {"model": "m", STATE: 7}
    # The helper's name goes to the member it was planned for, and no further.
    assert body_for(member, body) == {"model": "m", HANDOFF: {"from": "a"}}
    assert body_for(other, body) == {"model": "m"}
    assert body_for(remote, body) == {"model": "m"}


def test_a_helper_must_be_a_member_or_this_nodes_runtimed() -> None:
    found = registry(2, 1)
    lan = ProviderConfig(id="lan-peer", kind="peer", endpoint="http://l:1/v1", tier="lan",
                         models=("m",))
    found.config = Config(listen=(), providers=(LOCAL, lan), fleet=FLEET)
    found.providers["lan-peer"] = REGISTRY["peer"](lan, Paths.from_environment())
    handoff = Handoff(found)
    assert handoff.helper({"from": "b"}) == "fleet:b"
    assert handoff.helper({"from": "a"}) == "local"  # this node (FLEET.node)
    # A configured LAN peer that is not a member, an unknown node, junk:
    # not pulled from (the target prefills itself).
    for bad in ({"from": "lan-peer"}, {"from": "z"}, {"from": 3}, "b", None):
        assert handoff.helper(bad) is None
    assert handoff.counts["unknown"] == 5


class Recorder:
    """Stands in for runtimed: records what it is sent, answers a chat."""

    capabilities = Capabilities(load=True, prefill=True)
    config = LOCAL

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def load(self) -> dict[str, object]:
        return {"free_slots": 2, "total_slots": 2, "models": []}

    async def complete(self, endpoint: str, body: dict[str, object]) -> dict[str, object]:
        self.sent.append(body)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                             "finish_reason": "stop"}]}


def test_a_clients_descriptor_or_helper_is_never_used() -> None:
    """A client naming a descriptor (STATE) or a helper (HANDOFF, without
    being another node) gets an answer: runtimed is sent neither, and the
    gateway closes nothing of its own."""
    import json
    import os

    from syntrop.routerd.gateway import Gateway
    from syntrop.routerd.pressure import Pressure

    gateway = Gateway(Config(listen=(), providers=(LOCAL,)), Paths.from_environment(),
                      pressure=Pressure(25.0, read=lambda: 0.0))
    recorder = Recorder()
    gateway.registry.providers["local"] = recorder  # type: ignore[assignment]
    mine, other = os.pipe()
    try:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                           STATE: mine, HANDOFF: {"from": "a"}}).encode()
        answer = asyncio.run(gateway.handle("POST", "/v1/chat/completions", body))
        assert answer.status == 200
        assert recorder.sent and all(STATE not in b and HANDOFF not in b for b in recorder.sent)
        os.fstat(mine)  # still open
    finally:
        os.close(mine)
        os.close(other)


def test_the_prefill_endpoint_refuses_what_is_not_a_members_chat() -> None:
    """POST /v1/syntrop/prefill: 404 to a caller that is not another node,
    405 to another method, 400 to a body that is not a chat, 404 for a
    model this node's runtimed does not serve; each in OpenAI's error shape."""
    import json

    from syntrop.routerd.gateway import Gateway
    from syntrop.routerd.pressure import Pressure

    gateway = Gateway(Config(listen=(), providers=(LOCAL,), fleet=FLEET),
                      Paths.from_environment(), pressure=Pressure(25.0, read=lambda: 0.0))
    gateway.registry.set_fleet((MEMBER,))
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}).encode()
    cases = [("POST", chat, False, 404), ("GET", b"", True, 405),
             ("POST", b"{not json", True, 400), ("POST", b'{"model": "m"}', True, 400),
             ("POST", json.dumps({"model": "other", "messages": [
                 {"role": "user", "content": "Hi"}]}).encode(), True, 404)]
    for method, body, forwarded, status in cases:
        answer = asyncio.run(gateway.handle(method, "/v1/syntrop/prefill", body,
                                            forwarded=forwarded))
        assert answer.status == status, (method, body, answer.body)
        assert "error" in json.loads(answer.body)
    assert gateway.admission.busy["user"] == 0  # every place given back
