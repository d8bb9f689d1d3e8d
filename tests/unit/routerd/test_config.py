from pathlib import Path

import pytest

from syntrop.config import ConfigError
from syntrop.routerd.config import DEFAULT_LISTEN, DERIVED, parse, parse_address


def test_defaults() -> None:
    config = parse({})
    assert config.listen == DEFAULT_LISTEN
    assert config.default_model is None
    assert config.api_keys == frozenset()


def test_no_providers_configured_means_the_local_runtimed_with_modelds_models() -> None:
    for data in ({}, {"http": {"listen": ["127.0.0.1:0"]}}):
        config = parse(data)
        assert config.providers == DERIVED and config.derived
        assert [(p.kind, p.models) for p in config.providers] == [("runtimed", ())]
    none = parse({"providers": []})  # said explicitly: none
    assert none.providers == () and not none.derived


def test_api_keys_from_a_file_or_a_credential(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# clients\nsk-one\n\n  sk-two  \n")
    assert parse({"http": {"api_keys_file": str(keys)}}).api_keys == {"sk-one", "sk-two"}
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert parse({"http": {"api_keys_credential": "keys"}}).api_keys == {"sk-one", "sk-two"}
    assert "sk-one" not in repr(parse({"http": {"api_keys_file": str(keys)}}))
    (tmp_path / "empty").write_text("# nobody\n")
    for http, words in (({"api_keys_file": str(tmp_path / "empty")}, "names no key"),
                        ({"api_keys_file": str(tmp_path / "absent")}, "No such file"),
                        ({"api_keys_file": 3}, "are strings"),
                        ({"api_keys_file": str(keys), "api_keys_credential": "keys"},
                         "not both")):
        with pytest.raises(ConfigError, match=words):
            parse({"http": http})
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError, match="CREDENTIALS_DIRECTORY"):
        parse({"http": {"api_keys_credential": "keys"}})


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


@pytest.mark.parametrize("value", ['"8"', "-1", "5000", "true"])
def test_idle_connections_out_of_bounds_is_a_config_error(value: str) -> None:
    import tomllib

    data = tomllib.loads('[[providers]]\nid = "up"\nkind = "openai"\n'
                         f'endpoint = "http://127.0.0.1:1/v1"\nidle_connections = {value}\n')
    with pytest.raises(ConfigError, match="idle_connections"):
        parse(data)
    assert parse({"providers": [{"id": "up", "kind": "openai", "endpoint": "http://x/v1"}]}
                 ).providers[0].idle_connections == 256


def test_cors_origins() -> None:
    assert parse({}).cors_origins == ()
    assert parse({"http": {"cors_origins": ["http://localhost:3000", "*"]}}).cors_origins == (
        "http://localhost:3000", "*")
    for bad in (["localhost:3000"], ["http://a.example/path"], "http://a.example", [3]):
        with pytest.raises(ConfigError, match="cors_origins"):
            parse({"http": {"cors_origins": bad}})


def test_allowed_hosts() -> None:
    assert parse({}).allowed_hosts == ()
    hosts = parse({"http": {"allowed_hosts": ["Box.lan", "router.lan:8080"]}}).allowed_hosts
    assert hosts == ("box.lan", "router.lan:8080")
    for bad in ("box.lan", ["http://box.lan"], ["a/b"], ["*"], [""], [1]):
        with pytest.raises(ConfigError, match="allowed_hosts"):
            parse({"http": {"allowed_hosts": bad}})


def test_listening_beyond_loopback_needs_api_keys(tmp_path: Path) -> None:
    for listen in (["0.0.0.0:32768"], ["[::]:32768"], ["127.0.0.1:0", "10.0.0.7:32768"],
                   ["router.lan:32768"]):
        with pytest.raises(ConfigError, match=r"api_keys_file or http\.api_keys_credential"):
            parse({"http": {"listen": listen}})
    keys = tmp_path / "keys"
    keys.write_text("sk-one\n")
    parse({"http": {"listen": ["0.0.0.0:32768"], "api_keys_file": str(keys)}})
    # Loopback and Unix sockets are this machine's: no key needed.
    parse({"http": {"listen": ["127.0.0.1:0", "127.0.0.2:1", "[::1]:0", "localhost:0",
                               "unix:/run/syntrop/router.sock"]}})
