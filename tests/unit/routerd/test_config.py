from pathlib import Path

import pytest

from syntrop.config import ConfigError
from syntrop.routerd.config import DEFAULT_LISTEN, parse, parse_address


def test_defaults() -> None:
    config = parse({})
    assert config.listen == DEFAULT_LISTEN
    assert config.providers == ()
    assert config.default_model is None


def test_addresses() -> None:
    assert parse_address("127.0.0.1:32768") == ("127.0.0.1", 32768)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address("unix:/run/syntrop/router.sock") == "/run/syntrop/router.sock"
    for bad in ("nohost", ":80", "x:99999", "[::1]"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_providers() -> None:
    config = parse({"default_model": "m", "providers": [
        {"id": "a", "kind": "openai", "endpoint": "http://127.0.0.1:1/v1", "models": ["m"],
         "cost": 2.5, "weight": 0.5},
        {"id": "b", "kind": "runtimed"},
    ]})
    a, b = config.providers
    assert (a.tier, a.cost, a.weight, a.models) == ("remote", 2.5, 0.5, ("m",))
    assert (b.tier, b.endpoint, b.api_key) == ("local", "", None)


@pytest.mark.parametrize("providers", [
    [{"id": "a", "kind": "nope"}],
    [{"id": "a", "kind": "openai"}],  # no endpoint
    [{"id": "a", "kind": "runtimed"}, {"id": "a", "kind": "runtimed"}],
    [{"id": "a", "kind": "runtimed", "weight": 2}],
    [{"id": "a", "kind": "runtimed", "cost": -1}],
    [{"id": "a", "kind": "runtimed", "tier": "moon"}],
    [{"id": "a", "kind": "runtimed", "models": "m"}],
])
def test_bad_providers(providers: list[dict[str, object]]) -> None:
    with pytest.raises(ConfigError):
        parse({"providers": providers})


def test_bad_listen() -> None:
    with pytest.raises(ConfigError):
        parse({"http": {"listen": ["nowhere"]}})


def test_api_key_from_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "key").write_text("sk-secret\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    config = parse({"providers": [{"id": "a", "kind": "openai", "endpoint": "http://h/v1",
                                   "api_key_credential": "key"}]})
    assert config.providers[0].api_key == "sk-secret"
    assert "sk-secret" not in repr(config)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError):
        parse({"providers": [{"id": "a", "kind": "openai", "endpoint": "http://h/v1",
                              "api_key_credential": "key"}]})
