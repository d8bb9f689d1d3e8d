"""Where a lease goes when its caller names no plane: the plane for one
lease, the planes for a gang's open slices, and the planes a model fits on.
Read-only over the topology, the quarantine and the arbiter's books."""

from dataclasses import replace

from syntrop.inferenced import arbiter as arb
from syntrop.inferenced.topology import Topology, choose
from syntrop.interfaces.inference import PlaneSlice


def best_plane(topology: Topology, quarantine: dict[str, str], arbiter: arb.Arbiter,
               priority: str, memory: int) -> str:
    """The fitting plane with the least room left (best fit), preferring
    accelerators over the CPU. With none fitting, the one that came closest
    (the arbiter may preempt there); arb.Exhausted when every plane is in
    quarantine."""
    fitting = [
        p for p in topology.planes
        if p.id not in quarantine and arbiter.available(p.id, priority) >= memory
    ]
    if not fitting:
        # Let the arbiter try preemption (and name the plane that came closest).
        candidates = [p for p in topology.planes if p.id not in quarantine]
        if not candidates:
            raise arb.Exhausted(plane="", requested=memory, available=0)
        return max(candidates, key=lambda p: arbiter.available(p.id, priority)).id
    return min(
        fitting,
        key=lambda p: (p.kind == "cpu", arbiter.available(p.id, priority) - memory),
    ).id


def place(slices: list[PlaneSlice], topology: Topology, quarantine: dict[str, str],
          arbiter: arb.Arbiter, priority: str) -> list[PlaneSlice]:
    """Give every slice without a plane the tightest fitting set;
    arb.Exhausted when no set of accelerators fits."""
    open_slices = [s for s in slices if not s.plane_id]
    if not open_slices:
        return slices
    taken = {s.plane_id for s in slices if s.plane_id}
    need = max(s.memory_bytes for s in open_slices)
    candidates = [
        p for p in topology.planes
        if p.kind != "cpu" and p.id not in taken and p.id not in quarantine
        and arbiter.available(p.id, priority) >= need
    ]
    pipeline = all(s.role == "pipeline" for s in open_slices)
    chosen = choose(candidates, len(open_slices), topology.numa_distances, pipeline=pipeline)
    if chosen is None:
        best = max((arbiter.available(p.id, priority) for p in topology.planes
                    if p.kind != "cpu"), default=0)
        raise arb.Exhausted(plane="", requested=need, available=best)
    if pipeline:
        open_slices = sorted(open_slices, key=lambda s: (s.stage_index or 0))
    assigned = dict(zip((id(s) for s in open_slices), chosen, strict=True))
    return [replace(s, plane_id=assigned[id(s)].id) if not s.plane_id else s for s in slices]


def fitting(topology: Topology, quarantine: dict[str, str], arbiter: arb.Arbiter,
            size: int) -> str:
    """The planes an Interactive lease of `size` fits on now, comma-separated,
    or "none"."""
    return ",".join(
        p.id for p in topology.planes
        if p.id not in quarantine and arbiter.available(p.id, "Interactive") >= size
    ) or "none"
