"""Gateway logic without sockets: offload when runtimed has no free slot,
and the request that continues a stream."""

import asyncio

from syntrop.config import Paths
from syntrop.routerd.config import Config, ProviderConfig
from syntrop.routerd.gateway import Gateway
from syntrop.routerd.pressure import Pressure
from syntrop.routerd.providers import Capabilities
from syntrop.routerd.request import read

LOCAL = ProviderConfig(id="local", kind="runtimed", tier="local", models=("m",))
REMOTE = ProviderConfig(id="remote", kind="openai", endpoint="http://h/v1", tier="remote",
                        models=("m",))


class Slots:
    """Stands in for runtimed's GetLoad."""

    capabilities = Capabilities(load=True)

    def __init__(self) -> None:
        self.free = 0

    async def load(self) -> dict[str, object]:
        return {"free_slots": self.free, "total_slots": 2, "models": []}


def with_slots() -> tuple[Gateway, Slots]:
    """A gateway of LOCAL (its GetLoad a stand-in) and REMOTE."""
    gateway = Gateway(Config(listen=(), providers=(LOCAL, REMOTE)), Paths.from_environment(),
                      pressure=Pressure(25.0, read=lambda: 0.0))
    slots = Slots()
    gateway.registry.providers["local"] = slots  # type: ignore[assignment]
    return gateway, slots


def test_no_free_slot_in_runtimed_offloads_and_a_freed_one_brings_work_back() -> None:
    async def main() -> list[list[str]]:
        gateway, slots = with_slots()
        orders = []
        for free in (0, 2):
            slots.free = free
            gateway.offload._load_at = float("-inf")
            gateway.offload.throttled()                      # asks in the background
            await asyncio.gather(*gateway.offload._tasks)
            orders.append([c.provider for c in gateway.router.route("m")])
        return orders

    assert asyncio.run(main()) == [["remote", "local"], ["local", "remote"]]


def test_continuation_replays_the_prompt_with_the_text_sent() -> None:
    chat = read("chat/completions", b'{"model": "m", "max_tokens": 10, '
                b'"messages": [{"role": "user", "content": "hi"}]}')
    again = chat.continued("Hello, wor", 3)
    assert again.body["messages"][-1] == {"role": "assistant", "content": "Hello, wor"}
    assert again.body["max_tokens"] == 7 and again.continuation
    assert again.turns == (("user", "hi"), ("assistant", "Hello, wor"))
    assert chat.body["messages"] == [{"role": "user", "content": "hi"}]  # untouched
    completion = read("completions", b'{"model": "m", "prompt": "1, 2,"}').continued(" 3,", 1)
    assert completion.body["prompt"] == "1, 2, 3," and not completion.continuation
    assert "max_tokens" not in completion.body
    assert read("completions", b'{"prompt": "x", "max_tokens": 2}').continued(
        "abc", 5).body["max_tokens"] == 1


def test_no_free_slot_seen_before_our_own_request_ended_is_not_believed() -> None:
    """runtimed is looked at once a second (a fleet member publishes about
    as often): a 'no free slot' seen while our own request held the slot
    must not send the next request elsewhere."""
    async def main() -> list[list[str]]:
        gateway, _ = with_slots()  # no free slot
        orders = []
        gateway.offload._load_at = float("-inf")
        gateway.offload.throttled()  # sees no free slot (our request holds it)
        await asyncio.gather(*gateway.offload._tasks)
        orders.append([c.provider for c in gateway.router.route("m")])
        gateway.router.ended("local")  # that request ended
        orders.append([c.provider for c in gateway.router.route("m")])
        gateway.offload._load_at = float("-inf")
        gateway.offload.throttled()  # full again, seen after: believed
        await asyncio.gather(*gateway.offload._tasks)
        orders.append([c.provider for c in gateway.router.route("m")])
        return orders

    assert asyncio.run(main()) == [["remote", "local"], ["local", "remote"],
                                   ["remote", "local"]]
