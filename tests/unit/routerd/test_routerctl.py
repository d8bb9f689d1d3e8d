from syntrop.cli.routerctl import format_providers, format_route, format_status
from syntrop.interfaces.router import Candidate, Provider


def test_status_like_the_seed() -> None:
    text = format_status({"uptime_usec": (2 * 3600 + 14 * 60) * 1_000_000,
                          "ingress": ["127.0.0.1:32768", "unix:/run/syntrop/router.sock"],
                          "rss_bytes": int(9.12 * 1024 * 1024), "memory_some": 0.0,
                          "providers_total": 3, "providers_healthy": 3,
                          "requests_total": 428, "routing_errors": 0, "ingress_failed": [],
                          "fleet": "off", "fleet_members": []},
                         "/run/syntrop/io.syntrop.Router1",
                         ["runtimed-local", "lan-runtimed", "local-vllm"])
    assert "Status: OPERATIONAL (Uptime: 2h 14m)" in text
    assert "Providers: 3 configured, 3 healthy (runtimed-local, lan-runtimed, local-vllm)" in text
    assert "Wire Ingress: 127.0.0.1:32768, unix:/run/syntrop/router.sock" in text
    assert "Memory RSS: 9.12 MiB" in text
    assert "Total Reqs: 428 served (0 routing errors)" in text


def test_providers_table() -> None:
    text = format_providers([Provider(id="runtimed-local", kind="runtimed", tier="local",
                                      status="healthy", weight=1.0, latency_ms=12.4,
                                      models=["a", "b"])])
    header, row = text.splitlines()
    assert header.split()[:3] == ["PROVIDER", "ID", "KIND"]
    assert row.split() == ["runtimed-local", "runtimed", "local", "HEALTHY", "1.0", "12.4ms",
                           "a,", "b"]


def test_route_explain() -> None:
    candidates = [Candidate(provider="p", model="m", score=96.4, speed=98.0, cost=100.0,
                            capability=90.0, selected=True),
                  Candidate(provider="q", model="n", score=81.2, speed=72.0, cost=100.0,
                            capability=75.0, selected=False)]
    assert format_route(candidates, True).splitlines() == [
        "ROUTING DECISION CANDIDATES:",
        "1. p / m [SCORE: 96.4] Speed: 98.0 Cost: 100.0 Cap: 90.0 (Selected)",
        "2. q / n [SCORE: 81.2] Speed: 72.0 Cost: 100.0 Cap: 75.0",
    ]
    assert format_route(candidates, False) == "p / m"


def test_route_explain_marks_cooling_and_throttled() -> None:
    candidates = [Candidate(provider="lan", model="m", score=70.0, speed=70.0, cost=100.0,
                            capability=50.0, selected=True),
                  Candidate(provider="local", model="m", score=80.0, speed=90.0, cost=100.0,
                            capability=50.0, selected=False, throttled=True),
                  Candidate(provider="remote", model="m", score=60.0, speed=50.0, cost=25.0,
                            capability=95.0, selected=False, cooling=True)]
    lines = format_route(candidates, True).splitlines()
    assert lines[2].endswith("Cap: 50.0 (Throttled: local under pressure)")
    assert lines[3].endswith("Cap: 95.0 (Cooling)")
