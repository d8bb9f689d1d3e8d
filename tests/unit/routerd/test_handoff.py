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
    found = asyncio.run(handoff.plan("m", [scored(first, prefix_chars), scored(second)],
                                     tokens))
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
            "m", [scored("fleet:b"), scored("local")], 3000)) is None


def test_each_provider_is_sent_only_its_part() -> None:
    found = registry(2, 1)
    body = {"model": "m", STATE: 7, HANDOFF: {"from": "a"}}
    runtimed = found.providers["local"]
    peer = REGISTRY["peer"](MEMBER, Paths.from_environment())
    remote = REGISTRY["openai"](ProviderConfig(id="r", kind="openai", endpoint="http://r/v1",
                                               tier="remote", models=("m",)),
                                Paths.from_environment())
    assert body_for(runtimed, body) == {"model": "m", STATE: 7}
    assert body_for(peer, body) == {"model": "m", HANDOFF: {"from": "a"}}
    assert body_for(remote, body) == {"model": "m"}


def test_a_helper_must_be_a_member() -> None:
    handoff = Handoff(registry(2, 1))
    assert handoff.helper({"from": "b"}) == "fleet:b"
    for bad in ({"from": "z"}, {"from": 3}, "b", None):
        refused = handoff.helper(bad)
        assert not isinstance(refused, str) and refused.status == 400
