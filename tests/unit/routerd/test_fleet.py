"""The fleet's parts: [fleet] parsing, etcd's JSON and failover, members from records,
when a node is degraded."""

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from syntrop.config import ConfigError
from syntrop.routerd import etcd
from syntrop.routerd.config import parse
from syntrop.routerd.fleet import Fleet


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_fleet_config_defaults_and_errors() -> None:
    assert parse({}).fleet.etcd == ()
    fleet = parse({"fleet": {"etcd": ["http://127.0.0.1:2379"], "node": "n1",
                             "advertise": "http://10.0.0.1:32768/v1", "ttl": 1}}).fleet
    assert (fleet.node, fleet.ttl, fleet.prefix) == ("n1", 2, "/syntrop/fleet/")  # ttl >= 2
    assert parse({"fleet": {"etcd": ["http://e:2379"],
                            "advertise": "http://x/v1"}}).fleet.node  # the host name
    for table, words in (({"etcd": ["e:2379"]}, "URLs"),
                         ({"etcd": ["http://e:2379"]}, "advertise"),
                         ({"etcd": [], "prefix": "nope"}, "prefix"),
                         ({"node": 3}, "string")):
        with pytest.raises(ConfigError, match=words):
            parse({"fleet": table})


def test_prefix_end_and_watch_messages() -> None:
    assert base64.b64decode(etcd.prefix_end("/a/")) == b"/a0"
    line = json.dumps({"result": {"header": {"revision": "7"}, "events": [
        {"kv": {"key": b64("/p/nodes/b"), "value": b64("{}")}},
        {"type": "DELETE", "kv": {"key": b64("/p/nodes/c")}}]}}).encode()
    assert etcd._events(line) == [etcd.Event("PUT", "/p/nodes/b", "{}", 7),
                                  etcd.Event("DELETE", "/p/nodes/c", "", 7)]
    assert etcd._events(b'{"result": {"created": true}}') == []
    assert etcd._events(b"not json") == []
    with pytest.raises(etcd.EtcdError, match="canceled"):
        etcd._events(b'{"result": {"canceled": true, "cancel_reason": "compacted"}}')


async def nothing() -> dict[str, object]:
    return {}


def test_members_become_peer_providers_and_bad_records_are_ignored() -> None:
    config = parse({"fleet": {"etcd": ["http://e:2379"], "node": "a",
                              "advertise": "http://a:1/v1", "peer_ca": "/ca.pem"}}).fleet
    seen: list[object] = []
    fleet = Fleet(config, lambda members, full, caches, free: seen.append((members, full, caches)),
                  nothing)
    fleet._apply("/syntrop/fleet/nodes/a", json.dumps({"endpoint": "http://a:1/v1"}))  # self
    fleet._apply("/syntrop/fleet/nodes/b", json.dumps(
        {"endpoint": "http://b:1/v1", "models": ["m"], "free_slots": 0,
         "caches": {"m": {"prefixes": ["0123456789abcdef"], "contexts": 1, "capacity": 4},
                    "bad": {"prefixes": 3}}}))
    fleet._apply("/syntrop/fleet/nodes/c", "not json")
    fleet._apply("/syntrop/fleet/nodes/d", json.dumps({"endpoint": "file:///x"}))
    (member,) = fleet.providers()
    assert (member.id, member.kind, member.tier, member.endpoint, member.models,
            member.tls_ca) == ("fleet:b", "peer", "lan", "http://b:1/v1", ("m",), "/ca.pem")
    assert fleet.free() == {"fleet:b": 0}  # c and d published none
    assert set(fleet.full()) == {"fleet:b"}  # published no free slot: throttled
    # What its runtimed holds, for affinity; a malformed entry is left out.
    assert fleet.caches() == (("fleet:b", "m", ["0123456789abcdef"], 1, 4),)


def test_a_full_member_is_tried_after_the_others() -> None:
    from syntrop.routerd import scoring
    from syntrop.routerd.config import ProviderConfig

    members = tuple(ProviderConfig(id=f"fleet:{n}", kind="peer", tier="lan",
                                   endpoint=f"http://{n}:1/v1", models=("m",)) for n in "bc")
    order = [s.provider for s in scoring.candidates("m", members, {})]
    assert order == ["fleet:b", "fleet:c"]
    full = scoring.candidates("m", members, {}, full=frozenset({"fleet:b"}))
    assert [(s.provider, s.throttled) for s in full] == [("fleet:c", False), ("fleet:b", True)]


def test_pressure_and_rss_come_from_syntrop_system(tmp_path: Path) -> None:
    from syntrop.routerd.pressure import read_memory_some
    from syntrop.system.process import rss_bytes

    pressure = tmp_path / "memory"
    pressure.write_text("some avg10=12.50 avg60=1.00 avg300=0.10 total=9\n"
                        "full avg10=3.00 avg60=0.00 avg300=0.00 total=1\n")
    assert read_memory_some(str(pressure)) == 12.5
    pressure.write_text("garbage\n")
    assert read_memory_some(str(pressure)) == 0.0
    assert read_memory_some(str(tmp_path / "absent")) == 0.0
    assert rss_bytes() > 1 << 20 and rss_bytes(2 ** 22 + 7) == 0


def test_a_member_whose_queue_is_over_the_bound_counts_as_full() -> None:
    config = parse({"fleet": {"etcd": ["http://e:2379"], "node": "a", "queue_bound": 2,
                              "advertise": "http://a:1/v1"}}).fleet
    assert config.queue_bound == 2 and parse({}).fleet.queue_bound == 4
    fleet = Fleet(config, lambda members, full, caches, free: None, nothing)
    for node, queued in (("b", 2), ("c", 3), ("d", None)):
        fleet._apply(f"/syntrop/fleet/nodes/{node}", json.dumps(
            {"endpoint": f"http://{node}:1/v1", "free_slots": 1, "queue_depth": queued}))
    assert set(fleet.full()) == {"fleet:c"}


class Flaky:
    """An etcd whose sessions fail `failures` times, each after an endpoint
    answered (`answers`: a member lost, the next one answers) or not."""

    def __init__(self, failures: int, answers: bool) -> None:
        self.failures, self.answers, self.sessions = failures, answers, 0
        self.answered_at = float("-inf")
        self.held = asyncio.Event()


def test_only_ttl_over_3_without_any_answer_is_degraded() -> None:
    """A session that fails is started again at once; only ttl/3 without
    any endpoint answering makes the node degraded."""
    config = parse({"fleet": {"etcd": ["http://e1:2379", "http://e2:2379"], "node": "a",
                              "advertise": "http://a:1/v1", "ttl": 2}}).fleet

    async def run(failures: int, answers: bool) -> list[str]:
        fleet = Fleet(config, lambda members, full, caches, free: None, nothing)
        flaky = Flaky(failures, answers)
        states: list[str] = []

        async def session() -> None:
            flaky.sessions += 1
            states.append(fleet.state)
            if fleet.state == "degraded" or flaky.sessions > flaky.failures:
                flaky.held.set()
                await asyncio.Event().wait()
            if flaky.answers:
                flaky.answered_at = time.monotonic()
            raise etcd.EtcdError("connection reset")

        fleet.etcd = flaky  # type: ignore[assignment]
        fleet._session = session  # type: ignore[method-assign]
        fleet.state = "ok"
        task = asyncio.get_running_loop().create_task(fleet._run())
        await asyncio.wait_for(flaky.held.wait(), 10)
        task.cancel()
        return states

    # Failing again and again for longer than ttl/3, an endpoint answering
    # each time: never degraded.
    assert asyncio.run(run(30, True)) == ["ok"] * 31
    # Nothing answers: degraded, once ttl/3 has passed since the first failure.
    states = asyncio.run(run(10 ** 6, False))
    assert states[-1] == "degraded" and states[:-1] == ["ok"] * (len(states) - 1)


def test_etcd_requests_fail_over_past_a_member_that_hangs_drops_or_refuses() -> None:
    """Three loopback stand-ins for etcd's gateway: one never answers, one
    drops the connection in the middle of its answer, one answers. Every
    request reaches the third, the renewal's stream too, and the next
    request starts there."""
    answers: list[bytes] = []
    done = asyncio.Event()
    handlers: set[asyncio.Task[Any]] = set()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        await reader.read(65536)
        await done.wait()
        writer.close()

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"kvs\"")
        await writer.drain()
        writer.transport.abort()
        writer.close()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        while request := await reader.read(65536):
            answers.append(request.split(b" ")[1])
            body = b'{"result": {"TTL": "3"}}\n' if b"keepalive" in request else \
                b'{"header": {"revision": "5"}, "kvs": []}'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        writer.close()

    async def main() -> None:
        servers = [await asyncio.start_server(handler, "127.0.0.1", 0)
                   for handler in (hang, drop, answer)]
        urls = tuple(f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers)
        client = etcd.Etcd(urls, timeout=0.3)
        assert await client.range_prefix("/p/") == (5, {})
        assert await client.keepalive(7) == 3
        assert client._good == 2 and client.answered_at > float("-inf")
        assert await client.range_prefix("/p/") == (5, {})  # straight to the third
        assert answers == [b"/v3/kv/range", b"/v3/lease/keepalive", b"/v3/kv/range"]
        client.close()
        done.set()
        await asyncio.gather(*handlers)
        for server in servers:
            server.close()
            await server.wait_closed()

    asyncio.run(main())
