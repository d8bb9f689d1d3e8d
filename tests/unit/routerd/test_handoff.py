"""When the entry node hands a chat's prefill off (handoff.py's plan), and
what each provider is sent of it (Handed): pure logic over a real
Registry, runtimed's load a stand-in."""

import asyncio
import itertools
import os
import stat
import threading
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from syntrop.config import Paths
from syntrop.routerd.config import Config, FleetConfig, ProviderConfig
from syntrop.routerd.handoff import MAX_PULLS, Handoff
from syntrop.routerd.providers import REGISTRY, Capabilities
from syntrop.routerd.providers.base import Handed
from syntrop.routerd.providers.openai import OpenAIProvider
from syntrop.routerd.providers.peer import PeerProvider
from syntrop.routerd.registry import Registry
from syntrop.routerd.request import HANDOFF, Request, read
from syntrop.routerd.scoring import Scored

LOCAL = ProviderConfig(id="local", kind="runtimed", tier="local", models=("m",))
MEMBER = ProviderConfig(id="fleet:b", kind="peer", endpoint="http://b:1/v1", tier="lan",
                        models=("m",))
CHAT = read("chat/completions",
            b'{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}')
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
    asked = read("chat/completions",
                 b'{"model": "m", "messages": [{"role": "user", "content": ""}]}')
    body = asked.sent()
    handed = Handed(helper="a", member="fleet:b")
    paths = Paths.from_environment()
    member = REGISTRY["peer"](MEMBER, paths)
    other = REGISTRY["peer"](ProviderConfig(id="fleet:c", kind="peer", endpoint="http://c:1/v1",
                                            tier="lan", models=("m",)), paths)
    remote = REGISTRY["openai"](ProviderConfig(id="r", kind="openai", endpoint="http://r/v1",
                                               tier="remote", models=("m",)), paths)
    assert isinstance(member, OpenAIProvider) and isinstance(other, OpenAIProvider) and \
        isinstance(remote, OpenAIProvider)
    # The helper's name goes to the member it was planned for, and no further.
    assert member._sent(asked, handed) == {**body, HANDOFF: {"from": "a"}}
    assert other._sent(asked, handed) == body
    assert remote._sent(asked, handed) == body
    assert member._sent(asked, None) == body


def test_a_state_is_handed_over_once_and_closed_when_never_taken() -> None:
    read, write = os.pipe()
    os.close(write)
    handed = Handed(read)
    assert handed.take() == read and handed.take() is None
    handed.close()  # taken: the taker's to close
    os.fstat(read)
    os.close(read)
    read, write = os.pipe()
    os.close(write)
    Handed(read).close()
    try:
        os.fstat(read)
        raise AssertionError("not closed")
    except OSError:
        pass


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
        self.handed: list[Handed | None] = []

    async def load(self) -> dict[str, object]:
        return {"free_slots": 2, "total_slots": 2, "models": []}

    async def complete(self, request: Request,
                       handed: Handed | None = None) -> dict[str, object]:
        self.sent.append(request.sent())
        self.handed.append(handed)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                             "finish_reason": "stop"}]}


def test_a_clients_descriptor_or_helper_is_never_used() -> None:
    """A client naming a descriptor or a helper (HANDOFF, without
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
                           "_syntrop_prefix_state": mine, HANDOFF: {"from": "a"}}).encode()
        answer = asyncio.run(gateway.handle("POST", "/v1/chat/completions", body))
        assert answer.status == 200
        assert recorder.sent and all(HANDOFF not in b for b in recorder.sent)
        assert recorder.handed == [None]
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


# pulling a member's state (peer.py's prefill, handoff.py's pull) -----------------

CHUNK = 64 << 10


class Canned:
    """Stands in for a member's answer to POST /v1/syntrop/prefill: `parts`
    of a state, generated as they are asked for, the last after `gate`."""

    status = 200

    def __init__(self, parts: Iterable[bytes], gate: asyncio.Event | None = None) -> None:
        self.parts, self.gate, self.closed = parts, gate, False

    async def body(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        if self.gate is not None:
            await self.gate.wait()

    def close(self) -> None:
        self.closed = True


class Member(PeerProvider):
    """A member whose prefills answer with Canned bodies."""

    def __init__(self, answer: Callable[[], Canned]) -> None:
        super().__init__(MEMBER)
        self.answer = answer
        self.answered: list[Canned] = []

    async def _open(self, method: str, path: str, body: bytes | None,
                    root: bool = False) -> Any:
        self.answered.append(self.answer())
        return self.answered[-1]


def drain(fd: int, into: bytearray) -> threading.Thread:
    """runtimed's side: `fd` read to its end by a thread into `into`'s
    buffer (allocated before, reused), the count kept in its first 8 bytes."""
    def read() -> None:
        view, total = memoryview(into)[8:], 0
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while count := pipe.readinto(view):
                total += count
        into[:8] = total.to_bytes(8, "little")

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def test_a_members_state_is_copied_through_a_pipe_in_bounded_chunks() -> None:
    """routerd runs under MemoryMax=32M and a state is tens of MB: 100 MiB
    copied through the pipe runtimed reads moves with routerd's memory
    (tracemalloc's peak, the reader's buffer allocated before) at a few
    chunks."""
    total = 1600 * CHUNK  # 100 MiB, made a chunk at a time
    member = Member(lambda: Canned(bytes(CHUNK) for _ in range(1600)))
    buffer = bytearray(8 + (1 << 20))

    async def pull() -> tuple[int, int]:
        tracemalloc.start()
        try:
            fd = await member.prefill(CHAT)
            assert stat.S_ISFIFO(os.fstat(fd).st_mode)
            reader = drain(fd, buffer)
            await member.copies[fd]
            await asyncio.to_thread(reader.join)
            return tracemalloc.get_traced_memory()[1], int.from_bytes(buffer[:8], "little")
        finally:
            tracemalloc.stop()

    peak, received = asyncio.run(pull())
    assert received == total
    assert peak < 4 * CHUNK, f"routerd held {peak} bytes copying {total}"
    assert member.answered[0].closed and not member.copies


def test_a_copy_ends_when_runtimed_stops_reading() -> None:
    """A reader gone (runtimed refused the state, or the chat never went
    to it and the gateway closed its descriptor) ends the copy."""
    member = Member(lambda: Canned(itertools.repeat(bytes(CHUNK))))  # endless

    async def pull() -> None:
        fd = await member.prefill(CHAT)
        copy = member.copies[fd]
        await asyncio.sleep(0.05)  # the pipe is full by now
        os.close(fd)
        await asyncio.wait_for(copy, 5)

    asyncio.run(pull())
    assert member.answered[0].closed and not member.copies


def test_at_most_max_pulls_at_once_the_others_prefill_themselves() -> None:
    gate = asyncio.Event()
    found = registry(2, 1)
    member = Member(lambda: Canned([b"state"], gate))
    found.providers["fleet:b"] = member
    handoff = Handoff(found)
    request = CHAT

    async def pulls() -> None:
        fds = [await handoff.pull("fleet:b", request) for _ in range(MAX_PULLS + 1)]
        assert fds[-1] is None and None not in fds[:-1]
        assert handoff.counts == {"pulled": MAX_PULLS, "busy": 1}
        assert handoff.pulling == MAX_PULLS
        gate.set()  # the states are through: the pulls are over
        for fd in fds[:-1]:
            assert fd is not None
            assert await asyncio.to_thread(os.read, fd, 64) == b"state"
            os.close(fd)
        await asyncio.gather(*member.copies.values())
        assert handoff.pulling == 0
        fd = await handoff.pull("fleet:b", request)
        assert fd is not None
        os.close(fd)
        await asyncio.gather(*member.copies.values())

    asyncio.run(pulls())
    assert handoff.pulling == 0 and len(member.answered) == MAX_PULLS + 1
