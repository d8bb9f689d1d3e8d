"""What the registries share: the artifact record, errors, settings."""

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from syntrop.config import ConfigError, load_toml

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True, slots=True, kw_only=True)
class Artifact:
    """What to fetch for a reference."""

    url: str
    sha256: str | None
    size: int | None
    filename: str
    headers: dict[str, str] = field(default_factory=dict)


class RegistryError(Exception):
    """A registry said no, or could not be reached. `status` is the HTTP
    status, 0 when no response came; `retryable` for 5xx and transport
    failures."""

    def __init__(self, message: str, *, status: int = 0, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Endpoints and credentials of the registries."""

    hf_endpoint: str | None = None
    hf_token: str | None = None
    ollama_endpoint: str | None = None
    #: Use http:// for a registry named in an ollama:// reference.
    insecure: bool = False
    timeout: float = 30.0
    retries: int = 3
    #: Non-global networks a pull may reach (syntrop.pull.addresses).
    allowed: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def load(cls, configuration: Path, environ: "os._Environ[str] | dict[str, str]",
             **overrides: Any) -> "Settings":
        """pull.toml in the configuration directory, then the environment:
        HF_ENDPOINT and HF_TOKEN (as huggingface_hub reads them),
        SYNTROP_OLLAMA_ENDPOINT, SYNTROP_PULL_ALLOW (CIDRs, comma-separated,
        added to [network] allow)."""
        path = configuration / "pull.toml"
        data = load_toml(path)
        hf = _table(data, "hf", path)
        ollama = _table(data, "ollama", path)
        transfer = _table(data, "transfer", path)
        network = _table(data, "network", path)
        values: dict[str, Any] = {
            "hf_endpoint": environ.get("HF_ENDPOINT") or _string(hf, "endpoint", path),
            "hf_token": environ.get("HF_TOKEN") or _string(hf, "token", path),
            "ollama_endpoint": environ.get("SYNTROP_OLLAMA_ENDPOINT")
            or _string(ollama, "endpoint", path),
        }
        timeout = transfer.get("timeout", 30.0)
        retries = transfer.get("retries", 3)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"{path}: transfer.timeout must be seconds")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"{path}: transfer.retries must be a count")
        values.update(timeout=float(timeout), retries=retries,
                      allowed=_allowed(network, environ.get("SYNTROP_PULL_ALLOW", ""), path))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _table(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: [{key}] must be a table")
    return value


def _allowed(network: dict[str, Any], extra: str, path: Path
             ) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """[network] allow (CIDRs) and allow_private (every network), plus
    the environment's CIDRs."""
    allow_private = network.get("allow_private", False)
    listed = network.get("allow", [])
    if not isinstance(allow_private, bool):
        raise ConfigError(f"{path}: network.allow_private must be true or false")
    if not isinstance(listed, list) or not all(isinstance(c, str) for c in listed):
        raise ConfigError(f"{path}: network.allow must be a list of CIDRs")
    texts = [*listed, *(c.strip() for c in extra.split(",") if c.strip())]
    if allow_private:
        texts += ["0.0.0.0/0", "::/0"]
    try:
        return tuple(ipaddress.ip_network(text, strict=False) for text in texts)
    except ValueError as error:
        raise ConfigError(f"{path}: network.allow or $SYNTROP_PULL_ALLOW: {error}") from None


def _string(table: dict[str, Any], key: str, path: Path) -> str | None:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{path}: {key} must be a string")
    return value


class Registry(Protocol):
    #: The reference type this registry resolves.
    reference: ClassVar[type]

    def __init__(self, settings: Settings, client: "httpx.Client") -> None: ...

    def resolve(self, reference: Any) -> Artifact: ...


def status_error(response: "httpx.Response", what: str, *, auth_hint: str = "") -> RegistryError:
    """A one-line error for a failed HTTP response."""
    status = response.status_code
    detail = response.headers.get("x-error-message", "")
    detail = f" ({detail[:200]})" if detail else ""
    if status in (401, 403):
        hint = f"; {auth_hint}" if auth_hint else ""
        return RegistryError(f"{what}: not authorized (HTTP {status}){detail}{hint}", status=status)
    if status == 404:
        return RegistryError(f"{what}: not found (HTTP 404){detail}", status=status)
    if status == 429 or status >= 500:
        return RegistryError(f"{what}: server error (HTTP {status}){detail}", status=status,
                             retryable=True)
    return RegistryError(f"{what}: HTTP {status}{detail}", status=status)


def transport_error(error: Exception, what: str) -> RegistryError:
    """A failed connection: retryable, unless the server's certificate was
    refused (retrying cannot fix it; the message says what to check)."""
    import ssl

    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return RegistryError(f"{what}: the server's TLS certificate was refused "
                             f"({cause.verify_message or cause.reason}); not retried: check the "
                             "host name, the system clock and the trusted CAs", retryable=False)
    return RegistryError(f"{what}: {error or type(error).__name__}", retryable=True)
