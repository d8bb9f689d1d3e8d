"""routerd.toml: listeners, limits, providers. Pure parsing; no I/O but the
credential file of a provider's API key."""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syntrop.config import ConfigError

DEFAULT_LISTEN = ("127.0.0.1:32768", "[::1]:32768")
KINDS = ("openai", "runtimed")
TIERS = ("local", "lan", "remote")


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """One [[providers]] table."""

    id: str
    kind: str
    endpoint: str = ""
    tier: str = "local"
    models: tuple[str, ...] = ()
    cost: float = 0.0
    weight: float = 1.0
    capability: float = 50.0
    context_window: int = 8192
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class Config:
    """The whole file, validated."""

    listen: tuple[str, ...] = DEFAULT_LISTEN
    max_body_bytes: int = 1 << 20
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    default_model: str | None = None
    providers: tuple[ProviderConfig, ...] = ()


def parse_address(text: str) -> tuple[str, int] | str:
    """'host:port', '[v6]:port' or 'unix:/path' (returned as the path)."""
    if text.startswith("unix:"):
        return text[5:]
    if text.startswith("["):
        host, _, port = text[1:].partition("]:")
    else:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"not an address: {text!r}")
    return host, int(port)


def _number(table: dict[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{where}: {key} must be a non-negative number")
    return float(value)


def _credential(name: str, where: str) -> str:
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise ConfigError(f"{where}: api_key_credential set but no $CREDENTIALS_DIRECTORY")
    try:
        return (Path(directory) / name).read_text().strip()
    except OSError as error:
        raise ConfigError(f"{where}: credential {name!r}: {error.strerror}") from None


def parse(data: dict[str, Any], path: str = "routerd.toml") -> Config:
    """A Config from the decoded TOML; ConfigError says what is wrong."""
    http = data.get("http", {})
    if not isinstance(http, dict):
        raise ConfigError(f"{path}: [http] must be a table")
    listen = http.get("listen", list(DEFAULT_LISTEN))
    if not isinstance(listen, list) or not all(isinstance(a, str) for a in listen):
        raise ConfigError(f"{path}: http.listen must be a list of strings")
    for address in listen:
        try:
            parse_address(address)
        except ValueError as error:
            raise ConfigError(f"{path}: http.listen: {error}") from None
    providers: list[ProviderConfig] = []
    seen: set[str] = set()
    tables = data.get("providers", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: providers must be an array of tables")
    for index, table in enumerate(tables):
        where = f"{path}: providers[{index}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: must be a table")
        ident, kind = table.get("id"), table.get("kind")
        if not isinstance(ident, str) or not ident or ident in seen:
            raise ConfigError(f"{where}: id must be a unique non-empty string")
        seen.add(ident)
        if kind not in KINDS:
            raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}")
        tier = table.get("tier", "local" if kind == "runtimed" else "remote")
        if tier not in TIERS:
            raise ConfigError(f"{where}: tier must be one of {', '.join(TIERS)}")
        models = table.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise ConfigError(f"{where}: models must be a list of strings")
        endpoint = table.get("endpoint", table.get("address", ""))
        if not isinstance(endpoint, str) or (kind == "openai" and not endpoint):
            raise ConfigError(f"{where}: endpoint must be a string (required for openai)")
        weight = _number(table, "weight", 1.0, where)
        if weight > 1:
            raise ConfigError(f"{where}: weight must be between 0 and 1")
        credential = table.get("api_key_credential")
        api_key = _credential(credential, where) if isinstance(credential, str) else None
        providers.append(ProviderConfig(
            id=ident, kind=kind, endpoint=endpoint, tier=tier, models=tuple(models),
            cost=_number(table, "cost", 0.0, where), weight=weight,
            capability=min(100.0, _number(table, "capability", 50.0, where)),
            context_window=int(_number(table, "context_window", 8192, where)),
            api_key=api_key, timeout=_number(table, "timeout", 60.0, where) or 60.0,
        ))
    default = data.get("default_model")
    if default is not None and not isinstance(default, str):
        raise ConfigError(f"{path}: default_model must be a string")
    return Config(
        listen=tuple(listen),
        max_body_bytes=int(_number(http, "max_body_bytes", 1 << 20, path)),
        header_timeout=_number(http, "header_timeout", 10.0, path),
        body_timeout=_number(http, "body_timeout", 30.0, path),
        default_model=default,
        providers=tuple(providers),
    )


def load(path: Path) -> Config:
    from syntrop.config import load_toml

    return parse(load_toml(path), str(path))
