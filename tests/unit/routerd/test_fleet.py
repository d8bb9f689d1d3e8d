"""The fleet's pure parts: [fleet] parsing, etcd's JSON, members from records."""

import base64
import json
from pathlib import Path

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
    fleet = Fleet(config, lambda members, full, caches: seen.append((members, full, caches)),
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
    assert fleet.free_slots("fleet:b") == 0 and fleet.free_slots("fleet:x") is None
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
