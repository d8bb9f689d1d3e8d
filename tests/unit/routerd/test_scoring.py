from syntrop.routerd.config import ProviderConfig
from syntrop.routerd.scoring import Health, candidates, intent

LOCAL = ProviderConfig(id="local", kind="runtimed", tier="local", models=("small",),
                       capability=40, context_window=4096)
REMOTE = ProviderConfig(id="remote", kind="openai", endpoint="http://h/v1", tier="remote",
                        models=("big",), cost=3, capability=95, context_window=128000)
PROVIDERS = (LOCAL, REMOTE)


def test_intent() -> None:
    assert intent("router:fast", None) == "fast"
    assert intent("router:hard", None) == "hard"
    assert intent("router:auto", 10) == "fast"
    assert intent("router:auto", 10_000) == "hard"
    assert intent("m", None) == "model"


def test_fast_prefers_local_hard_prefers_capable() -> None:
    assert candidates("router:fast", PROVIDERS, {})[0].provider == "local"
    assert candidates("router:hard", PROVIDERS, {})[0].provider == "remote"


def test_scores_are_deterministic_and_explained() -> None:
    first = candidates("router:fast", PROVIDERS, {})
    assert first == candidates("router:fast", PROVIDERS, {})
    local = first[0]
    assert (local.speed, local.cost, local.capability) == (90.0, 100.0, 40.0)
    assert local.score == round(0.6 * 90 + 0.2 * 100 + 0.2 * 40, 1)


def test_explicit_model_and_context_window() -> None:
    assert [c.provider for c in candidates("big", PROVIDERS, {})] == ["remote"]
    assert candidates("unknown", PROVIDERS, {}) == []
    assert [c.provider for c in candidates("router:fast", PROVIDERS, {}, 10_000)] == ["remote"]


def test_latency_ewma_moves_speed() -> None:
    health = {"local": Health()}
    health["local"].success(50.0)
    assert candidates("small", PROVIDERS, health)[0].speed == 50.0
    health["local"].success(150.0)
    assert health["local"].latency_ms == 0.3 * 150 + 0.7 * 50


def test_cooling_goes_last_but_stays() -> None:
    health = {"local": Health()}
    health["local"].failure(now=100.0)
    assert health["local"].status(now=101.0) == "cooling"
    order = candidates("router:fast", PROVIDERS, health, now=101.0)
    assert [c.provider for c in order] == ["remote", "local"]
    assert order[1].cooling
    assert health["local"].status(now=200.0) == "unknown"
    health["local"].failure(now=200.0)  # second failure: longer
    assert health["local"].cooling_until == 210.0


def test_ties_go_to_configuration_order() -> None:
    twin = ProviderConfig(id="twin", kind="runtimed", tier="local", models=("small",),
                          capability=40)
    assert [c.provider for c in candidates("small", (LOCAL, twin), {})] == ["local", "twin"]
    assert [c.provider for c in candidates("small", (twin, LOCAL), {})] == ["twin", "local"]
