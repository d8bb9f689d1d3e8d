#!/usr/bin/env python3
"""What a fleet adds to routing a request: Router.route for a model that
3 and 10 fleet members serve (their peer providers, as fleet.py makes them
from etcd records), against the same gateway with the same number of static
peers in routerd.toml (the baseline, same run). In process, no I/O: the
figure is routing's own cost per request.

    python bench/bench_fleet.py [--requests N]

Convergence after a node dies (its lease's TTL) is measured by
tests/service/test_routerd_fleet.py on a real etcd cluster; docs/BENCHMARKS.md
has both.
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from syntrop.config import Paths
from syntrop.routerd.config import Config, FleetConfig, ProviderConfig
from syntrop.routerd.fleet import Fleet
from syntrop.routerd.gateway import Gateway


def _gateway(root: Path, static: int) -> Gateway:
    paths = Paths(runtime=root, state=root, cache=root, configuration=root)
    peers = tuple(ProviderConfig(id=f"peer{i}", kind="peer", tier="lan",
                                 endpoint=f"http://10.0.0.{i + 1}:32768/v1", models=("m",))
                  for i in range(static))
    gateway = Gateway(Config(listen=(), providers=peers), paths)
    gateway.offload.pressure.high = lambda: False  # type: ignore[method-assign]
    return gateway


async def _nothing() -> dict[str, object]:
    return {}


def _timed(gateway: Gateway, requests: int) -> list[float]:
    route = gateway.router.route
    samples = []
    for _ in range(requests):
        started = time.perf_counter_ns()
        candidates = route("m", 200)
        samples.append((time.perf_counter_ns() - started) / 1000)
        assert candidates
    return samples


def run(requests: int) -> list[tuple[int, float, float, float, float]]:
    """(members, fleet p50, p99, static p50, p99) in microseconds."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for members in (3, 10):
            fleet_gateway = _gateway(root, 0)
            fleet = Fleet(FleetConfig(etcd=("http://127.0.0.1:1",), node="self",
                                      advertise="http://self:1/v1"),
                          fleet_gateway.registry.set_fleet, _nothing)
            for i in range(members):
                fleet._apply(f"/syntrop/fleet/nodes/n{i}",
                             f'{{"endpoint": "http://10.0.0.{i + 1}:32768/v1", '
                             f'"models": ["m"], "free_slots": 4}}')
            fleet._changed()
            static_gateway = _gateway(root, members)
            for gateway in (fleet_gateway, static_gateway):
                _timed(gateway, 200)  # warm
            ours = _timed(fleet_gateway, requests)
            base = _timed(static_gateway, requests)
            rows.append((members, statistics.median(ours), _p99(ours),
                         statistics.median(base), _p99(base)))
    return rows


def _p99(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()

    async def in_a_loop() -> list[tuple[int, float, float, float, float]]:
        return run(args.requests)

    rows = asyncio.run(in_a_loop())
    print(f"Gateway.route per request, {args.requests} requests "
          f"(load {os.getloadavg()[0]:.1f}):")
    print("members | fleet p50 / p99 | static peers (baseline) p50 / p99 | ratio p50")
    for members, p50, p99, b50, b99 in rows:
        print(f"{members:7} | {p50:6.1f} / {p99:6.1f} µs | {b50:6.1f} / {b99:6.1f} µs | "
              f"{p50 / b50:.2f}x")


if __name__ == "__main__":
    main()
