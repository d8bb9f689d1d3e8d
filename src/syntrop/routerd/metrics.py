"""/metrics: routerd's counters and gauges in the Prometheus text format
(version 0.0.4)."""

from typing import Protocol

from syntrop.routerd.handoff import Handoff
from syntrop.routerd.offload import Offload
from syntrop.routerd.queues import Admission
from syntrop.routerd.registry import Registry
from syntrop.routerd.routing import Router


class Counted(Protocol):
    """What /metrics reads of the gateway (gateway.py renders with it)."""

    answered: dict[tuple[str, int], int]
    requests_total: int
    continuations: int
    admission: Admission
    registry: Registry
    offload: Offload
    router: Router
    handoff: Handoff


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(gateway: Counted) -> str:
    registry, offload, router = gateway.registry, gateway.offload, gateway.router
    from syntrop.system.process import rss_bytes

    lines: list[str] = []

    def metric(name: str, kind: str, help_: str,
               samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")

    metric("routerd_http_responses_total", "counter", "HTTP answers by endpoint and status.",
           [({"endpoint": path, "code": str(code)}, n)
            for (path, code), n in sorted(gateway.answered.items())])
    metric("routerd_requests_total", "counter", "Model requests received.",
           [({}, gateway.requests_total)])
    metric("routerd_routing_errors_total", "counter",
           "Model requests answered with a routing or upstream error.",
           [({}, router.routing_errors)])
    metric("routerd_stream_continuations_total", "counter",
           "Streams continued on another provider after a failure mid-stream.",
           [({}, gateway.continuations)])
    metric("routerd_prefill_handoffs_total", "counter",
           "Prefill hand-offs: planned here, states pulled or failed, prefills served.",
           [({"outcome": o}, n) for o, n in sorted(gateway.handoff.counts.items())])
    metric("routerd_provider_attempts_total", "counter",
           "Requests sent to a provider, by outcome.",
           [({"provider": p, "outcome": o}, n) for (p, o), n in sorted(router.attempts.items())])
    now_status = {p: h.status() for p, h in registry.health.items()}
    metric("routerd_provider_up", "gauge", "1 unless the provider is cooling after failures.",
           [({"provider": p}, 0 if s == "cooling" else 1) for p, s in now_status.items()])
    metric("routerd_provider_latency_ms", "gauge",
           "Latency EWMA to the answer or first chunk, milliseconds.",
           [({"provider": p}, h.latency_ms) for p, h in registry.health.items()
            if h.latency_ms is not None])
    metric("routerd_breakers_open", "gauge", "(provider, model) circuit breakers not closed.",
           [({}, sum(1 for b in registry.breakers.values() if b.failures))])
    metric("routerd_inflight", "gauge", "Requests at providers now, by queue.",
           [({"queue": k}, v) for k, v in gateway.admission.busy.items()])
    metric("routerd_queued", "gauge", "Requests waiting for a slot, by queue.",
           [({"queue": k}, len(v)) for k, v in gateway.admission.waiting.items()])
    metric("routerd_memory_pressure_some", "gauge", "Host memory PSI some avg10, percent.",
           [({}, offload.pressure.memory_some())])
    metric("routerd_local_throttled", "gauge", "1 while local work is offloaded.",
           [({}, 1 if offload.throttled() else 0)])
    metric("routerd_resident_memory_bytes", "gauge", "routerd's VmRSS.",
           [({}, rss_bytes())])
    return "\n".join(lines) + "\n"
