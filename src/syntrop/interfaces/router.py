"""io.syntrop.Router1: control of the OpenAI-compatible gateway (routerd)."""

from dataclasses import dataclass
from typing import TypedDict

from asyncvarlink import TypedVarlinkErrorReply

from syntrop.interfaces import names
from syntrop.varlink.authz import not_authorized
from syntrop.varlink.contract import Interface, method

NAME = names.ROUTER


@dataclass(frozen=True, slots=True, kw_only=True)
class Provider:
    """A backend routerd can send requests to.

    Fields:
        id: Provider identifier from the configuration.
        kind: runtimed, openai or peer.
        tier: local, lan or remote.
        status: healthy, cooling, down or unknown.
        weight: Configured weight, 0 to 1.
        latency_ms: Latency EWMA; null before the first request.
        models: Models it serves.
        rtt_ms: A LAN peer's advertised round-trip time; null otherwise.
        free_accelerator_bytes: A LAN peer's advertised free accelerator
            memory; null when unknown.
    """

    id: str
    kind: str
    tier: str
    status: str
    weight: float
    latency_ms: float | None
    models: list[str]
    rtt_ms: float | None = None
    free_accelerator_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One scored (provider, model) pair of a routing decision.

    Fields:
        provider: The provider.
        model: The model at that provider.
        score: Total score, 0 to 100.
        speed: Speed score.
        cost: Cost score.
        capability: Capability score.
        selected: Whether this candidate would be chosen.
        cooling: Its circuit breaker is open (or probed by another request).
        throttled: Local, and demoted by memory pressure or no free slots.
        prefix_chars: Characters of the chat's prefix (Route's messages)
            whose KV the candidate holds, as it reports (or routerd sent
            there in the last seconds): the longer, the earlier.
        cache_full: Its KV cache has no room for a new prefix while
            another candidate's has: it comes after those.
    """

    provider: str
    model: str
    score: float
    speed: float
    cost: float
    capability: float
    selected: bool
    cooling: bool = False
    throttled: bool = False
    prefix_chars: int | None = None
    cache_full: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteMessage:
    """A chat message, as in an OpenAI request.

    Fields:
        role: system, user, assistant, tool or developer.
        content: Its text.
    """

    role: str
    content: str


class StatusResult(TypedDict):
    uptime_usec: int
    ingress: list[str]
    rss_bytes: int
    memory_some: float
    providers_total: int
    providers_healthy: int
    requests_total: int
    routing_errors: int
    ingress_failed: list[str]
    fleet: str
    fleet_members: list[str]


class ModelsResult(TypedDict):
    models: list[str]
    aliases: list[str]
    default_model: str | None


class TestResult(TypedDict):
    ok: bool
    latency_ms: float
    detail: str


class ProviderNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No provider has this identifier.

    Parameters:
        provider: The identifier asked for.
    """

    class Parameters:
        provider: str


class NoRoute(TypedVarlinkErrorReply, interface=NAME):
    """No healthy provider serves the model.

    Parameters:
        model: The model or alias asked for.
        reason: Why none qualifies.
    """

    class Parameters:
        model: str
        reason: str


class ConfigInvalid(TypedVarlinkErrorReply, interface=NAME):
    """The configuration could not be loaded; the previous one stays.

    Parameters:
        path: The file.
        reason: What is wrong.
    """

    class Parameters:
        path: str
        reason: str


NotAuthorized = not_authorized(NAME)


class Router1(Interface, name=NAME):
    """OpenAI-compatible gateway routing between local runtimed, LAN peers
    and remote APIs by speed, cost, capability and host pressure."""

    errors = (ProviderNotFound, NoRoute, ConfigInvalid, NotAuthorized)

    @method
    def GetStatus(self) -> StatusResult:
        """Uptime, ingress, memory, pressure and totals.

        Returns:
            uptime_usec: Time since start.
            ingress: Addresses the HTTP API listens on.
            rss_bytes: Resident memory of routerd.
            memory_some: avg10 of "some" memory pressure, percent.
            providers_total: Configured providers.
            providers_healthy: Providers currently healthy.
            requests_total: Requests served since start.
            routing_errors: Requests that found no route.
            ingress_failed: HTTP addresses routerd could not listen on, each
                with why (e.g. "127.0.0.1:32768: Address already in use").
            fleet: off (no [fleet]), starting, ok, or degraded (etcd does not
                answer: the last members known are routed to).
            fleet_members: The other nodes of the fleet, by id.
        """

    @method(return_parameter="providers")
    def ListProviders(self) -> list[Provider]:
        """The configured providers and their health.

        Returns:
            providers: The providers.
        """

    @method
    def ListModels(self) -> ModelsResult:
        """Models reachable through routerd.

        Returns:
            models: Models of connected providers.
            aliases: router:fast, router:hard, router:auto.
            default_model: The model used when a request names none.
        """

    @method(return_parameter="candidates")
    def Route(self, *, model: str, prompt_tokens: int | None = None,
              messages: list[RouteMessage] | None = None) -> list[Candidate]:
        """Explain how a request for a model would be routed.

        Parameters:
            model: A model or an alias.
            prompt_tokens: Size of the request, for capability and difficulty.
            messages: A chat request's messages, for prefix affinity.

        Returns:
            candidates: Scored candidates, best first.
        """

    @method
    def TestProvider(self, *, provider: str) -> TestResult:
        """Probe a provider now.

        Parameters:
            provider: The provider.

        Returns:
            ok: Whether it answered correctly.
            latency_ms: Time to answer.
            detail: What it answered, in words.
        """

    @method
    def Reload(self) -> None:
        """Re-read the configuration and the providers' model lists without
        dropping requests in flight."""
