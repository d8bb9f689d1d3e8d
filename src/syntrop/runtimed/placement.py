"""Where a model's layers go, from what inferenced granted: llama.cpp's load
settings for a lease on one plane or a gang (composite) lease on several.

A pure module: it reads no file and imports neither llama_cpp nor the
Varlink interfaces. Its inputs are a `ModelShape` (what the model weighs,
per repeating block and in all, at its context: `shape_from_gguf` builds
one from GGUF metadata and the file's size; `estimated_bytes` is the lease
to ask for), a `Grant` (one lease, `Grant.single`, or a composite lease's
slices, `Grant.from_slices`, role "pipeline" with stage_index or "tensor")
and `PlaneView`s (each plane's kind, KINDS; its device index in the engine;
its NUMA node and nearby cores: `planes_from_topology` builds them).
`place()` answers a `Placement`: n_gpu_layers, main_gpu, split_mode,
tensor_split, threads and their affinity, and a one-line `why`.

How llama.cpp places layers (load_tensors in the pinned version): the token
embeddings stay on the host; n_gpu_layers counts n_layer + 1 slots (the
blocks, then the output head) from the end: all of them put everything on the
devices, k <= n_layer the head and the last k - 1 blocks (older versions: the
last k blocks, the head on the host); a k is chosen here only when it fits
either way. Several devices cut the slots by tensor_split's cumulative shares
(float32, first split point above slot / count), in device order, and a
block's KV cache lives where the block does; row split cuts every offloaded
matrix by the same shares instead.

Sizes are upper bounds where they cannot be exact (`shape_from_gguf`), and
every device keeps a reserve for compute buffers and its backend's context:
a placement errs towards fewer layers on a device, never more than it holds.
"""

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# A device's compute reserve is that of runtimed's leases: at least
# COMPUTE_MIN, and COMPUTE_SHARE of the weights.
from syntrop.runtimed.leases import COMPUTE_MIN, COMPUTE_SHARE

#: llama.cpp's enum llama_split_mode (llama_cpp.LLAMA_SPLIT_MODE_NONE,
#: _LAYER, _ROW), written out so that nothing here imports llama_cpp.
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}
#: llama.cpp's LLAMA_MAX_DEVICES: tensor_split has at most this many entries.
MAX_DEVICES = 16
#: VRAM a GPU backend takes for itself on each device it opens (its
#: context, library workspaces), not counted in llama.cpp's buffers. An
#: estimate; not measured on this project's machines (none has a GPU).
GPU_CONTEXT_BYTES = 512 << 20
#: Bytes per element of the KV cache types runtimed offers (protocol.KV_TYPES),
#: and a few more llama.cpp has: ggml block size / elements per block.
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32,
                 "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32}
#: The fewest bytes per weight a block's matrices take in a file of each
#: general.file_type (llama.cpp's LLAMA_FTYPE): the file's own type for the
#: uniform ones, one K-quant below the name for the K-quant mixes (Q2_K's
#: for Q3_K_*). Used only as a lower bound: unknown types (the IQ ones)
#: take the smallest there is.
FILE_TYPE_MIN_BYTES = {0: 4.0, 1: 2.0, 32: 2.0, 7: 34 / 32, 2: 18 / 32, 3: 20 / 32,
                       8: 22 / 32, 9: 24 / 32, 10: 84 / 256, 11: 84 / 256, 12: 84 / 256,
                       13: 84 / 256, 14: 110 / 256, 15: 110 / 256, 16: 144 / 256,
                       17: 144 / 256, 18: 176 / 256}
LEAST_BYTES_PER_WEIGHT = 0.19  # IQ1_S, 1.56 bits
KINDS = ("drm_gpu", "nvidia_gpu", "npu", "cpu")
#: What the GPU backend runs on (nvidia_gpu: no DRM node, as in VMs).
GPU_KINDS = frozenset({"drm_gpu", "nvidia_gpu"})
ROLES = ("pipeline", "tensor")


class PlacementError(ValueError):
    """The grant cannot hold the model as asked (or is malformed)."""


# the model ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A model's memory at the context it will run with.

    `layer_bytes` and `output_bytes` are upper bounds (exact when built
    from tensor sizes); `weight_bytes` bounds everything that goes on the
    devices when all slots are offloaded (the input embeddings stay on the
    host, the output head is its equal or its copy when tied).
    """

    n_layers: int
    #: Weights of the largest repeating block.
    layer_bytes: int
    #: Weights of the output head (and the final norm).
    output_bytes: int
    #: All weights (the file's tensor data).
    weight_bytes: int
    #: K and V of one block at the context (every sequence's cells).
    kv_bytes_per_layer: int
    #: Compute buffers a device needs beside weights and KV.
    compute_bytes: int
    #: Whether the sizes came from the file's tensors, not estimates.
    exact: bool = False

    def __post_init__(self) -> None:
        if self.n_layers < 1:
            raise PlacementError(f"a model of {self.n_layers} layers")
        for name in ("layer_bytes", "output_bytes", "weight_bytes", "kv_bytes_per_layer",
                     "compute_bytes"):
            if getattr(self, name) < 0:
                raise PlacementError(f"{name} {getattr(self, name)} < 0")


def _number(metadata: Mapping[str, Any], key: str, default: int = 0) -> int:
    """An integer metadata value: the typed header reader's int, or
    llama-cpp-python's string (Llama.metadata)."""
    value = metadata.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(value) if isinstance(value, str) else default
    except ValueError:
        return default


def compute_reserve(weight_bytes: int) -> int:
    return max(COMPUTE_MIN, int(weight_bytes * COMPUTE_SHARE))


def shape_from_gguf(metadata: Mapping[str, Any], file_size: int, *, n_ctx: int | None = None,
                    n_seq: int = 1, kv_type: str = "f16",
                    tensor_bytes: Mapping[str, int] | None = None) -> ModelShape:
    """The shape of a GGUF model from its header metadata (as the typed
    header reader or `Llama.metadata` gives it) and the file's size, for
    `n_seq` sequences of `n_ctx` tokens (default: the model's
    context_length) with a `kv_type` KV cache.

    KV bytes per block = n_seq x n_ctx x head_count_kv x (key_length +
    value_length) x bytes per element (f16: 2), the lengths defaulting to
    embedding_length / head_count; sliding-window blocks are counted at the
    full context (an upper bound).

    Weights: with `tensor_bytes` (tensor name -> bytes, from the file's
    tensor table) exactly: the largest blk.N.*, output.weight (or the tied
    token_embd.weight) plus output_norm. Without, bounds from the file's
    size W: a block holds at most (W - the token embeddings' least size) /
    n_layer (W / n_layer when the vocabulary size is not in the metadata);
    the output head at most W less what every block's attention q and o
    and two FFN matrices at the file type's smallest quantization must
    take. The compute reserve is max(64 MiB, W / 10)."""
    arch = metadata.get("general.architecture")
    prefix = f"{arch}." if isinstance(arch, str) else ""
    n_layers = _number(metadata, prefix + "block_count")
    if n_layers < 1:
        raise PlacementError(f"the metadata gives no {prefix}block_count")
    if file_size <= 0:
        raise PlacementError(f"a model file of {file_size} bytes")
    embd = _number(metadata, prefix + "embedding_length")
    heads = _number(metadata, prefix + "attention.head_count", 1) or 1
    kv_heads = _number(metadata, prefix + "attention.head_count_kv", heads) or heads
    key = _number(metadata, prefix + "attention.key_length", embd // heads)
    value = _number(metadata, prefix + "attention.value_length", key)
    n_ff = _number(metadata, prefix + "feed_forward_length")
    vocab = _number(metadata, prefix + "vocab_size")
    if n_ctx is None:
        n_ctx = _number(metadata, prefix + "context_length") or 2048
    if n_ctx < 1 or n_seq < 1:
        raise PlacementError(f"a context of {n_seq} x {n_ctx} tokens")
    if kv_type not in KV_TYPE_BYTES:
        raise PlacementError(f"KV cache type {kv_type!r}: one of {', '.join(KV_TYPE_BYTES)}")
    kv = math.ceil(n_seq * n_ctx * kv_heads * (key + value) * KV_TYPE_BYTES[kv_type])

    if tensor_bytes is not None:
        blocks: dict[int, int] = {}
        for name, size in tensor_bytes.items():
            parts = name.split(".")
            if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
                blocks[int(parts[1])] = blocks.get(int(parts[1]), 0) + size
        if not blocks:
            raise PlacementError("the tensor sizes hold no blk.N tensors")
        head = tensor_bytes.get("output.weight", tensor_bytes.get("token_embd.weight", 0))
        output = head + tensor_bytes.get("output_norm.weight", 0) + \
            tensor_bytes.get("output_norm.bias", 0)
        # Tied embeddings: the head is token_embd, copied to the device, so
        # what the devices hold with every slot offloaded is at most this.
        weights = sum(tensor_bytes.values())
        return ModelShape(n_layers=n_layers, layer_bytes=max(blocks.values()),
                          output_bytes=output, weight_bytes=weights, kv_bytes_per_layer=kv,
                          compute_bytes=compute_reserve(weights), exact=True)

    file_type = _number(metadata, "general.file_type", -1)
    least = FILE_TYPE_MIN_BYTES.get(file_type, LEAST_BYTES_PER_WEIGHT)
    # Parameters every attention + FFN block has at least: q and o, and two
    # FFN matrices (three when gated).
    block_params = embd * heads * key + heads * value * embd + 2 * embd * n_ff
    least_blocks = min(file_size, int(n_layers * block_params * least))
    embeddings = int(vocab * embd * least) if vocab else 0
    layer = math.ceil(max(file_size - embeddings, 0) / n_layers)
    return ModelShape(n_layers=n_layers, layer_bytes=layer,
                      output_bytes=file_size - least_blocks, weight_bytes=file_size,
                      kv_bytes_per_layer=kv, compute_bytes=compute_reserve(file_size))


def estimated_bytes(shape: ModelShape, *, kind: str = "cpu") -> int:
    """The lease to ask for to hold the whole model on one plane of `kind`:
    weights + KV of every block + the compute reserve, and on a GPU its
    backend's context (GPU_CONTEXT_BYTES). For the CPU plane and a shape
    from `shape_from_gguf` without tensor sizes this is leases.need_bytes
    (file size + KV + max(64 MiB, a tenth))."""
    total = shape.weight_bytes + shape.n_layers * shape.kv_bytes_per_layer + shape.compute_bytes
    return total + (GPU_CONTEXT_BYTES if kind in GPU_KINDS else 0)


# the grant and the planes -------------------------------------------------


class SliceLike(Protocol):
    """What a granted slice has (interfaces.inference.PlaneSlice)."""

    @property
    def plane_id(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def stage_index(self) -> int | None: ...
    @property
    def memory_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Slice:
    plane_id: str
    memory_bytes: int
    role: str = "pipeline"
    stage_index: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """One lease (one slice, not composite) or a gang's slices."""

    slices: tuple[Slice, ...]
    composite: bool = False

    @classmethod
    def single(cls, plane_id: str, memory_bytes: int) -> "Grant":
        """AcquireLease's answer (or a LeaseInfo): plane_id, allocated_memory."""
        return cls(slices=(Slice(plane_id=plane_id, memory_bytes=memory_bytes),))

    @classmethod
    def from_slices(cls, slices: Iterable[SliceLike]) -> "Grant":
        """AcquireCompositeLease's allocated_slices (or a CompositeLease's
        slices), each with its plane."""
        return cls(slices=tuple(Slice(plane_id=s.plane_id, memory_bytes=s.memory_bytes,
                                      role=s.role, stage_index=s.stage_index)
                                for s in slices), composite=True)

    @property
    def mode(self) -> str:
        """single, pipeline or tensor (PlacementError for mixed roles)."""
        if not self.composite:
            return "single"
        roles = {s.role for s in self.slices}
        if not roles <= set(ROLES):
            raise PlacementError(f"slice roles {sorted(roles)}: pipeline or tensor")
        if len(roles) != 1:
            raise PlacementError("a gang of pipeline and tensor slices: one role for all")
        return roles.pop()


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaneView:
    """A plane as placement needs it."""

    id: str
    #: ComputePlane.kind: drm_gpu, nvidia_gpu, npu or cpu.
    kind: str
    #: The device's number in the engine's backend (main_gpu, tensor_split):
    #: GPUs in PCI address order (CUDA_DEVICE_ORDER=PCI_BUS_ID). None for cpu.
    device_index: int | None
    numa_node: int | None
    #: The CPU cores near the plane: its NUMA node's; all of them (or its
    #: node's) for the CPU plane. Empty when unknown.
    cpus: tuple[int, ...] = ()


def parse_cpulist(text: str) -> tuple[int, ...]:
    """A kernel CPU list ("0-3,8,10-11", /sys/devices/system/node/nodeN/cpulist)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise PlacementError(f"not a CPU list: {text.strip()!r}") from None
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def planes_from_topology(topology: Any, node_cpus: Mapping[int, Sequence[int]], *,
                         device_order: Sequence[str] | None = None) -> list[PlaneView]:
    """PlaneViews of an inferenced.topology.Topology (its `planes`: PlaneInfo
    id, kind, numa_node, pci_chain; its `cpu_cores`), with `node_cpus`
    (NUMA node -> its CPUs, from each node's cpulist). GPUs are numbered in
    PCI address order, which is the CUDA backend's order under
    CUDA_DEVICE_ORDER=PCI_BUS_ID (`Placement.environment` sets it), unless
    `device_order` lists their ids in the backend's own order."""
    every = tuple(sorted({c for cpus in node_cpus.values() for c in cpus})) or \
        tuple(range(int(topology.cpu_cores)))
    gpus = [p for p in topology.planes if p.kind in GPU_KINDS]
    if device_order is None:
        ordered = sorted(gpus, key=lambda p: (p.pci_chain[-1] if p.pci_chain else "~", p.id))
        index = {p.id: i for i, p in enumerate(ordered)}
    else:
        index = {plane_id: i for i, plane_id in enumerate(device_order)}
    views = []
    for plane in topology.planes:
        near = tuple(sorted(node_cpus.get(plane.numa_node, ()))) \
            if plane.numa_node is not None else ()
        views.append(PlaneView(
            id=plane.id, kind=plane.kind,
            device_index=index.get(plane.id) if plane.kind in GPU_KINDS else None,
            numa_node=plane.numa_node,
            cpus=(near or every) if plane.kind == "cpu" else near,
        ))
    return views


# the answer ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """llama.cpp's load settings for a grant. Device numbers are the
    backend's over every GPU of the host (`masked` views renumber them)."""

    #: Slots on the devices: 0 (CPU only) to n_layer + 1 (every block and
    #: the output head); see the module's note on k <= n_layer.
    n_gpu_layers: int
    main_gpu: int
    split_mode: str  # none, layer or row
    #: Shares per device number, zeros for devices outside the grant; None
    #: with one device.
    tensor_split: tuple[float, ...] | None
    n_threads: int
    cpu_affinity: tuple[int, ...] | None
    why: str
    #: The granted GPUs' device numbers, main (stage 0) first, pipeline
    #: stages in stage order.
    devices: tuple[int, ...] = ()
    #: Blocks per plane id (llama.cpp's current counting), the host as
    #: "host"; and the plane holding the output head.
    layers: tuple[tuple[str, int], ...] = ()
    output_on: str = "host"

    def llama_kwargs(self, *, masked: bool = False) -> dict[str, Any]:
        """Keyword arguments of llama_cpp.Llama. `masked`: for a process
        whose environment is `environment()`, where only the granted GPUs
        are visible, numbered in `devices` order from 0."""
        kwargs: dict[str, Any] = {"n_gpu_layers": self.n_gpu_layers,
                                  "split_mode": SPLIT_MODES[self.split_mode]}
        if masked:
            kwargs["main_gpu"] = 0
            if self.tensor_split is not None:
                kwargs["tensor_split"] = [self.tensor_split[d] for d in self.devices]
        else:
            kwargs["main_gpu"] = self.main_gpu
            if self.tensor_split is not None:
                kwargs["tensor_split"] = list(self.tensor_split)
        if self.n_threads > 0:
            kwargs["n_threads"] = kwargs["n_threads_batch"] = self.n_threads
        return kwargs

    def environment(self) -> dict[str, str]:
        """Environment for the engine process, set before the backend loads:
        GPUs numbered in PCI order, only the granted ones visible (a CPU
        placement sees none, so a GPU build does not run big batches'
        matrix products on a device it holds no lease on)."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in self.devices)}


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _split_points(shares: Sequence[float]) -> list[float]:
    """llama.cpp's cumulative, normalised split points, in float32."""
    points, total = [], 0.0
    for share in shares:
        total = _f32(total + _f32(share))
        points.append(total)
    return [_f32(p / total) for p in points]


def assign(n_layers: int, n_gpu_layers: int, shares: Sequence[float], *,
           output_counts: bool = True) -> tuple[list[int], int | None]:
    """Blocks per device and the output head's device (None: the host) for
    `n_gpu_layers` slots cut by `shares`, as llama.cpp's load_tensors does
    (`output_counts`: the current counting, where slot n_layer is the output
    head and k <= n_layer slots hold it and k - 1 blocks; False: the older
    one, k blocks and the head on the host)."""
    points = _split_points(shares)
    start = max(n_layers + (1 if output_counts else 0) - n_gpu_layers, 0)
    active = min(n_gpu_layers, n_layers + 1)
    blocks = [0] * len(shares)
    output: int | None = None
    for slot in range(n_layers + 1):
        if slot < start or slot - start >= active:
            continue
        x = _f32(_f32(float(slot - start)) / float(active))
        device = next((i for i, p in enumerate(points) if p > x), len(points) - 1)
        if slot == n_layers:
            output = device
        else:
            blocks[device] += 1
    return blocks, output


def _fits(shape: ModelShape, k: int, memory: Sequence[int], shares: Sequence[float],
          row: bool) -> bool:
    """Whether k slots fit every device under both countings."""
    for output_counts in (True, False):
        blocks, output = assign(shape.n_layers, k, shares, output_counts=output_counts)
        on_devices = sum(blocks) * shape.layer_bytes + \
            (shape.output_bytes if output is not None else 0)
        everything = sum(blocks) == shape.n_layers and output is not None
        if everything:
            on_devices = min(on_devices, shape.weight_bytes)
        total = sum(shares)
        for device, budget in enumerate(memory):
            if row:
                weights = math.ceil(on_devices * shares[device] / total)
            else:
                weights = blocks[device] * shape.layer_bytes + \
                    (shape.output_bytes if output == device else 0)
                if everything and len(memory) == 1:
                    weights = min(weights, shape.weight_bytes)
            need = weights + blocks[device] * shape.kv_bytes_per_layer
            if need > budget:
                return False
    return True


def _threads(near: PlaneView, planes: Sequence[PlaneView],
             ) -> tuple[int, tuple[int, ...] | None, str]:
    """Threads on the cores near `near`, else on every core the CPU plane
    lists, else the engine's default (0)."""
    cpus = near.cpus
    where = f"NUMA node {near.numa_node}" if near.numa_node is not None else \
        "every core" if near.kind == "cpu" else f"the cores of {near.id}"
    if not cpus:
        cpu = next((p for p in planes if p.kind == "cpu" and p.cpus), None)
        cpus, where = (cpu.cpus, "every core") if cpu is not None else ((), "")
    if not cpus:
        return 0, None, "threads: the engine's default (no CPU list)"
    return len(cpus), cpus, f"{len(cpus)} threads on {where}"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _check_slices(grant: Grant, by_id: dict[str, PlaneView]) -> None:
    """Each slice on a known plane of a kind the engine runs, one per plane."""
    seen: set[str] = set()
    for s in grant.slices:
        if s.plane_id not in by_id:
            raise PlacementError(f"slice on unknown plane {s.plane_id!r}")
        if s.plane_id in seen:
            raise PlacementError(f"two slices on plane {s.plane_id}")
        seen.add(s.plane_id)
        if s.memory_bytes <= 0:
            raise PlacementError(f"slice on {s.plane_id} of {s.memory_bytes} bytes")
        kind = by_id[s.plane_id].kind
        if kind == "npu":
            raise PlacementError(f"{s.plane_id} is an NPU: the engine has no backend for it")
        if kind not in KINDS:
            raise PlacementError(f"{s.plane_id} is of unknown kind {kind!r}")
        if kind in GPU_KINDS and by_id[s.plane_id].device_index is None:
            raise PlacementError(f"GPU {s.plane_id} has no device number")


def _in_stage_order(slices: list[Slice]) -> list[Slice]:
    """A pipeline's GPU slices by stage (those without one last, as given)."""
    stages = [s.stage_index for s in slices if s.stage_index is not None]
    if len(set(stages)) != len(stages):
        raise PlacementError(f"pipeline stages {sorted(stages)} repeat")
    order = sorted(range(len(slices)), key=lambda i: (
        slices[i].stage_index is None, slices[i].stage_index or 0, i))
    return [slices[i] for i in order]


def _usable(model: ModelShape, slices: list[Slice], reserve: int) -> list[int]:
    """What each GPU slice holds for layers beside the compute and context
    reserve; a slice of a gang must hold at least one layer."""
    usable = []
    for s in slices:
        use = s.memory_bytes - reserve
        if use <= 0:
            raise PlacementError(
                f"slice on {s.plane_id} of {_gib(s.memory_bytes)} is below the "
                f"{_gib(reserve)} compute and context reserve")
        if len(slices) > 1 and use < model.layer_bytes + model.kv_bytes_per_layer:
            raise PlacementError(
                f"slice on {s.plane_id} of {_gib(s.memory_bytes)} holds no layer beside the "
                f"{_gib(reserve)} compute and context reserve")
        usable.append(use)
    return usable


def place(model: ModelShape, grant: Grant, planes: Sequence[PlaneView]) -> Placement:
    """The load settings for `model` on `grant` over `planes` (see the
    module's docstring). PlacementError when the grant cannot hold it."""
    if not grant.slices:
        raise PlacementError("a grant without slices")
    mode = grant.mode
    by_id = {p.id: p for p in planes}
    _check_slices(grant, by_id)
    cpu_slices = [s for s in grant.slices if by_id[s.plane_id].kind == "cpu"]
    gpu_slices = [s for s in grant.slices if by_id[s.plane_id].kind in GPU_KINDS]
    if len(cpu_slices) > 1:
        raise PlacementError("more than one CPU slice")
    if cpu_slices and mode == "tensor":
        raise PlacementError("a CPU slice in a tensor (row split) gang: rows split over "
                             "GPUs only")

    if not gpu_slices:
        cpu = by_id[cpu_slices[0].plane_id]
        threads, affinity, where = _threads(cpu, planes)
        return Placement(n_gpu_layers=0, main_gpu=0, split_mode="none", tensor_split=None,
                         n_threads=threads, cpu_affinity=affinity,
                         why=f"CPU lease on {cpu.id}: all {model.n_layers} layers on the host; "
                             f"{where}",
                         layers=(("host", model.n_layers),), output_on="host")

    if mode == "pipeline":
        gpu_slices = _in_stage_order(gpu_slices)
    indices = [by_id[s.plane_id].device_index for s in gpu_slices]
    devices = tuple(i for i in indices if i is not None)
    if max(devices) >= MAX_DEVICES:
        raise PlacementError(f"device number {max(devices)}: llama.cpp takes at most "
                             f"{MAX_DEVICES} devices")
    if len(set(devices)) != len(devices):
        raise PlacementError(f"two slices on device number(s) {sorted(devices)}")
    reserve = model.compute_bytes + GPU_CONTEXT_BYTES
    usable = _usable(model, gpu_slices, reserve)
    row = mode == "tensor" and len(gpu_slices) > 1
    total = sum(usable)
    shares = [u / total for u in usable]
    # The fit is checked in stage order and in device-number order: the
    # masked and the unmasked kwargs cut the same shares in those orders.
    by_number = sorted(range(len(devices)), key=lambda i: devices[i])
    orders = [list(range(len(devices)))]
    if by_number != orders[0]:
        orders.append(by_number)
    chosen = next((k for k in range(model.n_layers + 1, 0, -1)
                   if all(_fits(model, k, [usable[i] for i in o], [shares[i] for i in o], row)
                          for o in orders)), 0)
    if chosen == 0:
        raise PlacementError(
            f"the grant ({', '.join(f'{s.plane_id} {_gib(s.memory_bytes)}' for s in gpu_slices)}"
            f") cannot hold the first slot llama.cpp offloads (the output head, "
            f"{_gib(model.output_bytes)}; in older versions a layer, "
            f"{_gib(model.layer_bytes + model.kv_bytes_per_layer)} with its KV) beside the "
            f"{_gib(reserve)} compute and context reserve")

    single = len(gpu_slices) == 1
    split_mode = "none" if single else ("row" if row else "layer")
    tensor_split: tuple[float, ...] | None = None
    numbered = [p.device_index for p in planes if p.kind in GPU_KINDS
                and p.device_index is not None]
    if not single:
        width = min(max([*numbered, *devices]) + 1, MAX_DEVICES)
        split = [0.0] * width
        for device, share in zip(devices, shares, strict=True):
            split[device] = share
        tensor_split = tuple(split)
    blocks, output = assign(model.n_layers, chosen, [shares[i] for i in by_number])
    layers = [(gpu_slices[i].plane_id, blocks[j]) for j, i in enumerate(by_number)]
    host = model.n_layers - sum(blocks)
    if host:
        layers.append(("host", host))
    output_on = gpu_slices[by_number[output]].plane_id if output is not None else "host"
    main = by_id[gpu_slices[0].plane_id]
    threads, affinity, where = _threads(main, planes)
    if chosen == model.n_layers + 1:
        what = f"all {model.n_layers} layers and the output head on GPU"
    else:
        what = (f"{sum(blocks)} of {model.n_layers} layers on GPU, {host} on the host "
                f"(hybrid; the head on {output_on})")
    if single:
        how = f"1 GPU ({main.id}, device {main.device_index}, {_gib(gpu_slices[0].memory_bytes)})"
    else:
        how = (f"{len(gpu_slices)} GPUs {mode} ({split_mode} split): " + ", ".join(
            f"{s.plane_id} device {by_id[s.plane_id].device_index} {shares[i]:.2f}"
            for i, s in enumerate(gpu_slices)))
    return Placement(
        n_gpu_layers=chosen, main_gpu=devices[0], split_mode=split_mode,
        tensor_split=tensor_split, n_threads=threads, cpu_affinity=affinity,
        why=f"{how}: {what}; {where}" + ("" if model.exact else " (sizes estimated)"),
        devices=devices, layers=tuple(layers), output_on=output_on,
    )
