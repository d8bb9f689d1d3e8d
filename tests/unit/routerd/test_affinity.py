"""Prefix affinity in routing (affinity.py, scoring.py): the provider that
holds a chat's start comes first, a new start goes where there is room, and
routerd's own decisions count until a report says otherwise."""

import asyncio
from typing import Any

from syntrop.config import Paths
from syntrop.interfaces.runtime import LoadedModel
from syntrop.prefix import chain, reported
from syntrop.routerd.affinity import PREDICT_S, Affinity
from syntrop.routerd.config import Config, ProviderConfig
from syntrop.routerd.gateway import Gateway
from syntrop.routerd.pressure import Pressure
from syntrop.routerd.providers import Capabilities
from syntrop.routerd.request import turns

A = ProviderConfig(id="a", kind="runtimed", tier="local", models=("m",))
B = ProviderConfig(id="b", kind="peer", endpoint="http://b/v1", tier="lan", models=("m",))
C = ProviderConfig(id="c", kind="peer", endpoint="http://c/v1", tier="lan", models=("m",))
RIVERS = [("system", "Rivers. " * 200), ("user", "Which is longest?")]
HILLS = [("system", "Hills. " * 200), ("user", "Which is highest?")]


def body(turns: list[tuple[str, str]]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in turns]}


def test_the_holder_of_the_longest_prefix_comes_first() -> None:
    affinity = Affinity()
    affinity.report("b", "m", reported(RIVERS), 1, 4, now=0.0)
    assert affinity.match("b", "m", chain(RIVERS), now=1.0) == (len(RIVERS[0][1]) + 17, True)
    follow_up = [*RIVERS, ("assistant", "The Nile."), ("user", "And the widest?")]
    assert affinity.match("b", "m", chain(follow_up), now=1.0)[0] == len(RIVERS[0][1]) + 17
    assert affinity.match("c", "m", chain(RIVERS), now=1.0) == (0, None)


def test_a_decision_counts_until_it_is_old_and_fills_the_room() -> None:
    affinity = Affinity()
    affinity.report("b", "m", [], 1, 2, now=0.0)
    affinity.routed("b", "m", chain(HILLS), now=1.0)
    assert affinity.match("b", "m", chain(HILLS), now=2.0) == (len(HILLS[0][1]) + 17, False)
    assert affinity.match("b", "m", chain(HILLS), now=2.0 + PREDICT_S) == (0, True)


def gateway_with(loads: dict[str, dict[str, Any]]) -> Gateway:
    class Load:
        capabilities = Capabilities(load=True)

        def __init__(self, report: dict[str, Any]) -> None:
            self.report = report

        async def load(self) -> dict[str, Any]:
            return self.report

    gateway = Gateway(Config(listen=(), providers=(A, B, C)), Paths.from_environment(),
                      pressure=Pressure(25.0, read=lambda: 0.0))
    for name in ("a", "b", "c"):  # stand-ins: nothing to ask, nothing to advertise
        gateway.registry.providers[name] = Load(loads.get(name) or {})  # type: ignore[assignment]
    return gateway


def test_routing_follows_the_prefix_and_spreads_new_ones() -> None:
    async def main() -> None:
        held = LoadedModel(name="m", resident_bytes=1, busy=0, sessions=0, keep_alive_s=1.0,
                           prefixes=list(reported(RIVERS)), cached_contexts=1)
        gateway = gateway_with({"a": {"free_slots": 1, "total_slots": 1, "models": [held]}})
        gateway.offload.throttled()
        await asyncio.gather(*gateway.offload._tasks)
        # Without a chain: the scores (a is local).
        assert gateway.router.route("m")[0].provider == "a"
        # a holds the rivers: they go there, whatever the tier.
        rivers = gateway.router.chain(turns(body(RIVERS)), "m")
        first = gateway.router.route("m", chain=rivers)
        assert first[0].provider == "a" and first[0].prefix_chars > 1000
        # Fleet members report caches with room; a has none left: hills go
        # to a member.
        gateway.registry.set_fleet((), caches=(("b", "m", [], 0, 2), ("c", "m", [], 1, 2)))
        hills = gateway.router.chain(turns(body(HILLS)), "m")
        order = gateway.router.route("m", chain=hills)
        assert [c.provider for c in order] == ["b", "c", "a"] and order[2].cache_full
        # A forwarded request is served here, even when a member holds it.
        gateway.registry.set_fleet((), caches=(("b", "m", list(reported(HILLS)), 1, 2),))
        assert gateway.router.route("m", chain=hills)[0].provider == "b"
        assert [c.provider for c in gateway.router.route("m", chain=hills, forwarded=True)] == ["a"]

    asyncio.run(main())


def test_new_prefixes_have_stable_homes_spread_over_the_caches() -> None:
    from syntrop.routerd import scoring

    providers = (A, B, C)

    def first(home: str) -> str:
        def affinity(provider: str, model: str) -> tuple[int, bool | None]:
            return 0, True

        return scoring.candidates("m", providers, {}, affinity=affinity, home=home)[0].provider

    homes = {f"prefix-{i}": first(f"prefix-{i}") for i in range(30)}
    assert set(homes.values()) == {"a", "b", "c"}
    assert all(first(home) == chosen for home, chosen in homes.items())
    # Without a home (a short chat): the scores, local first.
    assert scoring.candidates("m", providers, {})[0].provider == "a"


# homes by node identity ---------------------------------------------------------

NODES = ("a", "b", "c")


def entry(node: str) -> tuple[ProviderConfig, ...]:
    """What node `node` of a three-node fleet routes to: its own runtimed
    (the same id on every node) and the others as fleet members."""
    own = ProviderConfig(id="runtimed-local", kind="runtimed", tier="local", models=("m",))
    return (own, *(ProviderConfig(id=f"fleet:{n}", kind="peer", endpoint=f"http://{n}/v1",
                                  tier="lan", models=("m",)) for n in NODES if n != node))


def node_of(node: str) -> Any:
    return lambda provider: node if provider == "runtimed-local" else \
        provider.removeprefix("fleet:")


def served(node: str, key: str, full: frozenset[str] = frozenset(),
           throttled: bool = False) -> list[str]:
    """The nodes a request of prefix `key` entering at `node` tries, in order;
    `full`: members that published no free slot, `throttled`: its own
    runtimed has none."""
    from syntrop.routerd import scoring

    def affinity(provider: str, model: str) -> tuple[int, bool | None]:
        return 0, True

    found = scoring.candidates("m", entry(node), {}, affinity=affinity, home=key,
                               node_of=node_of(node), full=full, throttle_local=throttled)
    return [node_of(node)(c.provider) for c in found]


def test_rendezvous_is_over_node_ids_so_every_entry_node_picks_one_home() -> None:
    from syntrop.routerd import scoring

    keys = [f"prefix-{i}" for i in range(40)]
    for key in keys:
        order = scoring.homes(key, NODES)
        assert sorted(order) == sorted(NODES)
        assert order == scoring.homes(key, reversed(NODES))  # not the order listed
        assert all(served(node, key) == order for node in NODES), key
    # New prefixes still spread over the fleet.
    assert {scoring.homes(key, NODES)[0] for key in keys} == set(NODES)
    # A node joining takes some homes and moves no other.
    grown = {key: scoring.homes(key, (*NODES, "d"))[0] for key in keys}
    assert all(home in ("d", scoring.homes(key, NODES)[0]) for key, home in grown.items())
    assert "d" in grown.values()


def test_a_busy_home_overflows_to_the_next_in_the_same_order() -> None:
    from syntrop.routerd import scoring

    for key in (f"prefix-{i}" for i in range(20)):
        home, second, third = scoring.homes(key, NODES)
        assert scoring.homes(key, NODES, busy={home}) == [second, third, home]
        assert scoring.homes(key, NODES, busy={home, second}) == [third, home, second]
        # Every entry node overflows to the same node: the member's published
        # load (`full`), or its own runtimed's (throttled) on the home itself.
        for node in NODES:
            if node == home:
                order = served(node, key, throttled=True)
            else:
                order = served(node, key, full=frozenset({f"fleet:{home}"}))
            assert order == [second, third, home], (key, node, order)


def test_a_resident_prefix_overrides_the_hash() -> None:
    from syntrop.routerd import scoring

    key = "prefix-0"
    _, second, _ = scoring.homes(key, NODES)

    def affinity(provider: str, model: str) -> tuple[int, bool | None]:
        return (4 * scoring.AFFINITY_STEP if provider == f"fleet:{second}" else 0), True

    for node in NODES:
        if node == second:
            continue
        found = scoring.candidates("m", entry(node), {}, affinity=affinity, home=key,
                                   node_of=node_of(node))
        assert node_of(node)(found[0].provider) == second


def test_the_gateway_names_its_own_providers_by_its_node() -> None:
    from syntrop.routerd.config import FleetConfig

    config = Config(listen=(), providers=(A,), fleet=FleetConfig(
        etcd=("http://e:2379",), node="n1", advertise="http://n1/v1"))
    gateway = Gateway(config, Paths.from_environment(), pressure=Pressure(0.0))
    member = ProviderConfig(id="fleet:n2", kind="peer", endpoint="http://n2/v1", tier="lan",
                            models=("m",))
    gateway.registry.set_fleet((member,))
    assert [gateway.registry.node_of(p) for p in ("a", "fleet:n2", "fleet:gone")] == \
        ["n1", "n2", "fleet:gone"]
