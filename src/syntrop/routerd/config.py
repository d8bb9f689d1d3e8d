"""routerd.toml: listeners, limits, providers. Pure parsing; no I/O but the
credential file of a provider's API key."""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syntrop.config import ConfigError, integer, number

DEFAULT_LISTEN = ("127.0.0.1:32768", "[::1]:32768")
KINDS = ("openai", "runtimed", "peer")
DEFAULT_TIER = {"runtimed": "local", "peer": "lan", "openai": "remote"}
TIERS = ("local", "lan", "remote")
#: The id of the provider routerd derives when none is configured.
DERIVED_ID = "runtimed-local"


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
    #: Idle keep-alive connections kept open to an openai or peer upstream:
    #: as many as [routing] max_inflight allows in use at once, so that none
    #: is opened per request once warm (each idle one holds ~4 KiB).
    idle_connections: int = 256
    #: https endpoints: CA file (default: the system's), client certificate
    #: and key (mutual TLS, LAN peers).
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""


#: The providers of a routerd.toml that names none (or of no routerd.toml):
#: the local runtimed with modeld's models, so a fresh node answers.
#: `providers = []` says none.
DERIVED = (ProviderConfig(id=DERIVED_ID, kind="runtimed"),)


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """[fleet]: membership and load in etcd (routerd/fleet.py)."""

    #: etcd client URLs (http:// or https://); empty: no fleet.
    etcd: tuple[str, ...] = ()
    #: This node's id in the fleet (default: the host name).
    node: str = ""
    #: The OpenAI base URL other nodes reach this one at, e.g.
    #: https://10.0.0.7:32443/v1 (its tls_listen) or http://…:32768/v1.
    advertise: str = ""
    prefix: str = "/syntrop/fleet/"
    #: Seconds a dead node stays a member (its etcd lease's TTL).
    ttl: int = 5
    #: Least seconds between two publications of this node's load.
    publish_interval: float = 1.0
    #: Requests waiting at a node's runtimed over which it counts as full:
    #: a prefix whose home it is goes to its next home (scoring.homes).
    queue_bound: int = 4
    #: Prompt tokens still to prefill (about four characters each) from
    #: which a chat whose node is busy decoding is prefilled on an idle
    #: member and answered from that state (handoff.py); 0: never.
    handoff_tokens: int = 2048
    #: etcd's client TLS: its CA, our certificate and key.
    etcd_ca: str = ""
    etcd_cert: str = ""
    etcd_key: str = ""
    #: The other nodes' TLS (mutual, as for `peer` providers).
    peer_ca: str = ""
    peer_cert: str = ""
    peer_key: str = ""


@dataclass(frozen=True, slots=True)
class Config:
    """The whole file, validated."""

    listen: tuple[str, ...] = DEFAULT_LISTEN
    #: HTTPS listeners for LAN peers: mutual TLS, clients need a
    #: certificate signed by tls_client_ca.
    tls_listen: tuple[str, ...] = ()
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    max_body_bytes: int = 1 << 20
    #: Client connections served at once; one more is answered 503 and
    #: closed (each holds buffers: this keeps routerd inside MemoryHigh).
    max_connections: int = 64
    #: Origins a browser page may call from (CORS): exact origins such as
    #: "http://localhost:3000", or "*" for any; none by default.
    cors_origins: tuple[str, ...] = ()
    #: Host header values served over TCP besides the listen addresses,
    #: localhost, 127.0.0.1 and [::1]: "name" (any port) or "name:port".
    #: Any other Host is answered 421 (a DNS-rebinding page sends its own).
    allowed_hosts: tuple[str, ...] = ()
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    default_model: str | None = None
    providers: tuple[ProviderConfig, ...] = ()
    #: Seconds a request may wait for a cooling candidate or a queue slot.
    deadline: float = 30.0
    #: Memory PSI (some avg10, percent) above which local work is offloaded.
    psi_threshold: float = 25.0
    #: Where memory PSI is read: the host's, or a cgroup's memory.pressure.
    psi_file: str = "/proc/pressure/memory"
    #: Requests at providers at once; `triage_reserved` of them for triage.
    max_inflight: int = 256
    triage_reserved: int = 8
    #: Bearer tokens a client must present (Authorization: Bearer KEY);
    #: empty: no key needed. From http.api_keys_file or the credential
    #: named by http.api_keys_credential (LoadCredential=), one a line.
    api_keys: frozenset[str] = field(default=frozenset(), repr=False)
    #: No [[providers]] configured: the providers are DERIVED.
    derived: bool = False
    fleet: FleetConfig = field(default_factory=FleetConfig)


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


def _string(table: dict[str, Any], key: str, default: str, where: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key} must be a non-empty string")
    return value


def _credential(name: str, where: str) -> str:
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise ConfigError(f"{where}: a credential ({name!r}) is named but systemd passed none "
                          "($CREDENTIALS_DIRECTORY is not set)")
    try:
        return (Path(directory) / name).read_text().strip()
    except OSError as error:
        raise ConfigError(f"{where}: credential {name!r}: {error.strerror}") from None


def _api_keys(http: dict[str, Any], where: str) -> frozenset[str]:
    """The keys clients must present: one a line, blank lines and #
    comments skipped."""
    file, credential = http.get("api_keys_file"), http.get("api_keys_credential")
    if not all(value is None or isinstance(value, str) for value in (file, credential)):
        raise ConfigError(f"{where}: http.api_keys_file and api_keys_credential are strings")
    if file and credential:
        raise ConfigError(f"{where}: http.api_keys_file or api_keys_credential, not both")
    if not (file or credential):
        return frozenset()
    if file:
        try:
            text = Path(file).read_text()
        except OSError as error:
            raise ConfigError(f"{where}: http.api_keys_file {file}: {error.strerror}") from None
    else:
        text = _credential(str(credential), where)
    keys = frozenset(line.strip() for line in text.splitlines()
                     if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise ConfigError(f"{where}: the API key file names no key (it would lock every "
                          "client out)")
    return keys


def _addresses(http: dict[str, Any], key: str, path: str, default: list[str], *,
               tls: bool = False) -> list[str]:
    """http.listen or http.tls_listen: a list of addresses (TCP only for TLS)."""
    addresses = http.get(key, default)
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        raise ConfigError(f"{path}: http.{key} must be a list of strings")
    for address in addresses:
        try:
            if isinstance(parse_address(address), str) and tls:
                raise ValueError(f"TLS is for TCP addresses: {address!r}")
        except ValueError as error:
            raise ConfigError(f"{path}: http.{key}: {error}") from None
    return addresses


def _tls_files(http: dict[str, Any], tls_listen: list[str], path: str) -> dict[str, str]:
    files = {name: http.get(name, "") for name in ("tls_cert", "tls_key", "tls_client_ca")}
    if not all(isinstance(value, str) for value in files.values()):
        raise ConfigError(f"{path}: http.tls_cert, tls_key, tls_client_ca must be file paths")
    if tls_listen and not (files["tls_cert"] and files["tls_client_ca"]):
        raise ConfigError(f"{path}: http.tls_listen needs tls_cert (and tls_key) and "
                          "tls_client_ca: peers authenticate both ways")
    return files


def _provider(table: object, where: str, seen: set[str]) -> ProviderConfig:
    """One [[providers]] table (its id added to `seen`)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    ident, kind = table.get("id"), table.get("kind")
    if not isinstance(ident, str) or not ident or ident in seen:
        raise ConfigError(f"{where}: id must be a unique non-empty string")
    seen.add(ident)
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}")
    tier = table.get("tier", DEFAULT_TIER[kind])
    if tier not in TIERS:
        raise ConfigError(f"{where}: tier must be one of {', '.join(TIERS)}")
    models = table.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ConfigError(f"{where}: models must be a list of strings")
    endpoint = table.get("endpoint", table.get("address", ""))
    if not isinstance(endpoint, str) or (kind != "runtimed" and not endpoint):
        raise ConfigError(f"{where}: endpoint must be a string (required for {kind})")
    weight = number(table, "weight", 1.0, where)
    if weight > 1:
        raise ConfigError(f"{where}: weight must be between 0 and 1")
    tls = {}
    for name in ("tls_ca", "tls_cert", "tls_key"):
        value = table.get(name, "")
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {name} must be a file path")
        tls[name] = value
    if bool(tls["tls_cert"]) != bool(tls["tls_key"]):
        raise ConfigError(f"{where}: tls_cert and tls_key go together")
    credential = table.get("api_key_credential")
    api_key = _credential(credential, where) if isinstance(credential, str) else None
    return ProviderConfig(
        id=ident, kind=kind, endpoint=endpoint, tier=tier, models=tuple(models),
        cost=number(table, "cost", 0.0, where), weight=weight,
        capability=min(100.0, number(table, "capability", 50.0, where)),
        context_window=int(number(table, "context_window", 8192, where)),
        api_key=api_key, timeout=number(table, "timeout", 60.0, where) or 60.0,
        idle_connections=integer(table, "idle_connections", 256, where, maximum=4096),
        **tls,
    )


def parse(data: dict[str, Any], path: str = "routerd.toml") -> Config:
    """A Config from the decoded TOML; ConfigError says what is wrong."""
    http = data.get("http", {})
    if not isinstance(http, dict):
        raise ConfigError(f"{path}: [http] must be a table")
    listen = _addresses(http, "listen", path, list(DEFAULT_LISTEN))
    tls_listen = _addresses(http, "tls_listen", path, [], tls=True)
    tls_files = _tls_files(http, tls_listen, path)
    tables = data.get("providers", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: providers must be an array of tables")
    seen: set[str] = set()
    providers = [_provider(table, f"{path}: providers[{index}]", seen)
                 for index, table in enumerate(tables)]
    default = data.get("default_model")
    if default is not None and not isinstance(default, str):
        raise ConfigError(f"{path}: default_model must be a string")
    routing = data.get("routing", {})
    if not isinstance(routing, dict):
        raise ConfigError(f"{path}: [routing] must be a table")
    where = f"{path}: routing"
    keys = _api_keys(http, path)
    if not keys and (beyond := open_without_keys(listen)):
        raise ConfigError(f"{path}: http.listen {', '.join(beyond)} is beyond loopback: set "
                          "http.api_keys_file or http.api_keys_credential (or listen on "
                          "loopback only)")
    return Config(
        deadline=number(routing, "deadline", 30.0, where),
        psi_threshold=min(100.0, number(routing, "psi_threshold", 25.0, where)),
        psi_file=_string(routing, "psi_file", "/proc/pressure/memory", where),
        max_inflight=max(1, int(number(routing, "max_inflight", 256, where))),
        triage_reserved=int(number(routing, "triage_reserved", 8, where)),
        listen=tuple(listen),
        tls_listen=tuple(tls_listen),
        tls_cert=tls_files["tls_cert"], tls_key=tls_files["tls_key"],
        tls_client_ca=tls_files["tls_client_ca"],
        max_body_bytes=int(number(http, "max_body_bytes", 1 << 20, path)),
        max_connections=max(1, int(number(http, "max_connections", 64, path))),
        cors_origins=_origins(http, path),
        allowed_hosts=_allowed_hosts(http, path),
        header_timeout=number(http, "header_timeout", 10.0, path),
        body_timeout=number(http, "body_timeout", 30.0, path),
        default_model=default,
        providers=tuple(providers) if "providers" in data else DERIVED,
        derived="providers" not in data,
        api_keys=keys,
        fleet=_fleet(data, path),
    )


def is_loopback(host: str) -> bool:
    """Whether a listen address's host is this machine's loopback only."""
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve beyond loopback
        return False


def open_without_keys(listen: tuple[str, ...] | list[str]) -> list[str]:
    """The plain-HTTP TCP addresses beyond loopback: routerd serves these
    only with API keys (a Unix socket, or loopback, is this machine's)."""
    return [text for text in listen
            if not isinstance(where := parse_address(text), str) and not is_loopback(where[0])]


def _allowed_hosts(http: dict[str, Any], path: str) -> tuple[str, ...]:
    """http.allowed_hosts: names ("name" or "name:port"), no scheme or path."""
    hosts = http.get("allowed_hosts", [])
    if not isinstance(hosts, list) or not all(
            isinstance(h, str) and h and not any(c in h for c in "/ @*") for h in hosts):
        raise ConfigError(f"{path}: http.allowed_hosts must be a list of host names "
                          '("name" or "name:port")')
    return tuple(h.lower() for h in hosts)



def _origins(http: dict[str, Any], path: str) -> tuple[str, ...]:
    """http.cors_origins: "*" or origins (scheme://host[:port], no path)."""
    origins = http.get("cors_origins", [])
    if not isinstance(origins, list) or not all(
            isinstance(o, str) and (o == "*" or (o.startswith(("http://", "https://"))
                                                 and "/" not in o.split("://", 1)[1]))
            for o in origins):
        raise ConfigError(f"{path}: http.cors_origins must be a list of origins "
                          '(scheme://host[:port]) or "*"')
    return tuple(origins)


def _fleet(data: dict[str, Any], path: str) -> FleetConfig:
    table = data.get("fleet", {})
    where = f"{path}: fleet"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    etcd = table.get("etcd", [])
    if not isinstance(etcd, list) or not all(
            isinstance(u, str) and u.startswith(("http://", "https://")) for u in etcd):
        raise ConfigError(f"{where}.etcd must be a list of http:// or https:// URLs")
    strings = {}
    for name in ("node", "advertise", "prefix", "etcd_ca", "etcd_cert", "etcd_key",
                 "peer_ca", "peer_cert", "peer_key"):
        value = table.get(name, getattr(FleetConfig(), name))
        if not isinstance(value, str):
            raise ConfigError(f"{where}.{name} must be a string")
        strings[name] = value
    if etcd and not strings["advertise"].startswith(("http://", "https://")):
        raise ConfigError(f"{where}.advertise must be the http(s) URL other nodes reach "
                          "this node's /v1 at")
    if not strings["prefix"].startswith("/") or not strings["prefix"].endswith("/"):
        raise ConfigError(f"{where}.prefix must start and end with /")
    if not strings["node"]:
        import socket

        strings["node"] = socket.gethostname()
    return FleetConfig(etcd=tuple(etcd), ttl=max(2, int(number(table, "ttl", 5, where))),
                       publish_interval=number(table, "publish_interval", 1.0, where),
                       queue_bound=max(0, int(number(table, "queue_bound", 4, where))),
                       handoff_tokens=max(0, int(number(table, "handoff_tokens", 2048, where))),
                       **strings)


def load(path: Path) -> Config:
    from syntrop.config import load_toml

    return parse(load_toml(path), str(path))
