"""What runtimed says of itself: its load, for routers (GetLoad), and its
engine, for people (GetEngine)."""

import time
from typing import TYPE_CHECKING

from syntrop.interfaces.runtime import EngineResult, EngineVariant, LoadedModel, LoadResult

if TYPE_CHECKING:
    from syntrop.runtimed.cpu import Choice
    from syntrop.runtimed.residency import Residency
    from syntrop.runtimed.seats import Seats
    from syntrop.runtimed.slots import Slots


def load(residency: "Residency", seats: "Seats", slots: "Slots") -> LoadResult:
    """Slots, queue, resident models and what their idle contexts hold."""
    now = time.monotonic()
    models = []
    for name, m in sorted(residency.models.items()):
        sessions = sum(s.engine.resident is m for s in seats)
        # Each open session holds its model once; the rest are requests.
        batch_free = None if m.batch_running is None else \
            max(0, slots.total - m.batch_running)
        models.append(LoadedModel(name=name, resident_bytes=m.size,
                                  busy=max(0, m.busy - sessions), sessions=sessions,
                                  keep_alive_s=residency.keep_alive_left(m, now),
                                  batch_free=batch_free, prefixes=m.prefixes,
                                  cached_contexts=m.cached_contexts))
    return {
        "free_slots": slots.free,
        "total_slots": slots.total,
        "resident_bytes": sum(m.size for m in residency.models.values()),
        "loaded_models": sorted(residency.models),
        "queue_depth": slots.queue_depth,
        "models": models,
        "spilled_sessions": len(seats.spill),
    }


def engine(choice: "Choice", residency: "Residency") -> EngineResult:
    """The CPU code chosen and why, and every model's worker."""
    workers = residency.report(time.monotonic())
    info = next((r.worker.system_info for r in residency.models.values()
                 if r.worker.system_info), None)
    return {
        "cpu": choice.cpu, "build": choice.build, "variant": choice.variant,
        "variants": [EngineVariant(name=n, score=s) for n, s in
                     sorted(choice.scores.items(), key=lambda item: -item[1])],
        "amx": choice.amx.detail, "extra_buffer_types": choice.extra_bufts,
        "reason": choice.reason, "system_info": info, "workers": workers,
    }
