"""The placement a worker is sent with its model: placement.place over the
model's lease and this host's planes, turned into protocol.Placed.

The face holds the lease (leases.py), so it places; the worker only applies
what `load` brings (worker/host.py, worker/engine.py). The planes are
inferenced's (GetTopology: id and kind), each GPU's NUMA node and PCI path
read here from sysfs as inferenced's own scan reads them, and each NUMA
node's CPUs from its cpulist.

Threads: a context takes every core of its plane (cpu.plane_threads: the
CPUs the worker may run on), and the slot layout shares them between
concurrent generations step by step; the placement caps it only where it
pins. Pinning happens only where the
placement's cores come from a NUMA node (a GPU's, or a CPU plane that names
one), and the cap is then the pinned cores' count, so no context runs more
threads than the cores it is pinned to. A model without a lease (inferenced
unreachable), or one whose lease placement cannot use, runs on the CPU,
unpinned.
"""

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syntrop.runtimed import placement as pl
from syntrop.runtimed.protocol import Placed

logger = logging.getLogger(__name__)

#: Where each NUMA node's cpulist is, below the root.
NODES = Path("sys/devices/system/node")


@dataclass(frozen=True, slots=True)
class _Plane:
    """What placement.planes_from_topology reads of a plane."""

    id: str
    kind: str
    numa_node: int | None
    pci_chain: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Topology:
    planes: list[_Plane]
    cpu_cores: int


def node_cpus(root: Path = Path("/")) -> dict[int, tuple[int, ...]]:
    """NUMA node -> its CPUs (each node's cpulist); empty when unknown."""
    found = {}
    for path in sorted((root / NODES).glob("node*/cpulist")):
        if path.parent.name[4:].isdigit():
            try:
                found[int(path.parent.name[4:])] = pl.parse_cpulist(path.read_text())
            except (OSError, pl.PlacementError):
                continue
    return found


def host_planes(planes: Sequence[Any], root: Path = Path("/")) -> list[pl.PlaneView]:
    """PlaneViews of GetTopology's `planes` (each with id and kind) on the
    host under `root`."""
    from syntrop.system import sysfs

    pci = {a.id: a.pci for a in sysfs.accelerators(root)}
    known = []
    for plane in planes:
        device = pci.get(plane.id)
        known.append(_Plane(plane.id, plane.kind, device.numa_node if device else None,
                            device.chain if device else ()))
    return pl.planes_from_topology(_Topology(known, os.cpu_count() or 1), node_cpus(root))


def _near(placed: pl.Placement, grant: pl.Grant, planes: Sequence[pl.PlaneView]) -> pl.PlaneView:
    """The plane whose cores the placement's threads are on: the main GPU's,
    or the CPU slice's."""
    if placed.devices:
        return next(p for p in planes if p.kind in pl.GPU_KINDS
                    and p.device_index == placed.main_gpu)
    by_id = {p.id: p for p in planes}
    return next(by_id[s.plane_id] for s in grant.slices if by_id[s.plane_id].kind == "cpu")


def applied(placed: pl.Placement, grant: pl.Grant, planes: Sequence[pl.PlaneView]) -> Placed:
    """What the worker is sent for `placed` (see the module's docstring on
    threads and pinning)."""
    near = _near(placed, grant, planes)
    pinned = placed.cpu_affinity if near.numa_node is not None and placed.cpu_affinity \
        else None
    kwargs = placed.llama_kwargs()
    split = kwargs.get("tensor_split")
    threads = (f"pinned to the {len(pinned)} cores of NUMA node {near.numa_node}, threads "
               "there" if pinned else "not pinned, threads: the plane's cores (cpu.plane_threads)")
    head, _, tail = placed.why.rpartition("; ")
    devices = (head or placed.why) + (" (sizes estimated)" if tail.endswith("estimated)")
                                      else "")
    return Placed(n_gpu_layers=kwargs["n_gpu_layers"], split_mode=kwargs["split_mode"],
                  main_gpu=kwargs["main_gpu"],
                  tensor_split=None if split is None else tuple(split),
                  n_threads=len(pinned) if pinned else 0, cpu_affinity=pinned,
                  why=f"{devices}; {threads}")


def on_cpu(why: str) -> Placed:
    """The CPU, unpinned, every core: a model without a usable lease."""
    return Placed(why=f"{why}: on the CPU, not pinned, threads: the plane's cores "
                      "(cpu.plane_threads)")


def for_lease(grant: pl.Grant | None, metadata: Mapping[str, Any], size: int, *, n_ctx: int,
              slots: int, planes: Sequence[Any], root: Path = Path("/")) -> Placed:
    """The placement of a model of `size` bytes with GGUF `metadata`, for
    `slots` contexts of `n_ctx` tokens, on `grant` over GetTopology's
    `planes` (None: unleased)."""
    if grant is None:
        return on_cpu("unleased")
    try:
        shape = pl.shape_from_gguf(metadata, size, n_ctx=n_ctx, n_seq=slots)
        views = host_planes(planes, root)
        return applied(pl.place(shape, grant, views), grant, views)
    except pl.PlacementError as error:
        logger.warning("placement cannot use the lease (%s): the model runs on the CPU", error)
        return on_cpu(f"not placed ({error})")
