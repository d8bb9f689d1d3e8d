"""Placement from leases (placement.py), on the fake sysfs trees of the
topology tests (tests/fakesysfs.py) read through inferenced's own topology
scan: a CPU-only host, one GPU (whole model, then hybrid), two GPUs
(pipeline and tensor), four GPUs over two NUMA nodes; the errors; and,
for any grant, that no device is given more than its slice holds."""

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from syntrop.inferenced.topology import DeviceConfig, TopologyConfig, choose, scan
from syntrop.runtimed import leases
from syntrop.runtimed import placement as pl
from syntrop.runtimed.placement import Grant, ModelShape, PlacementError, PlaneView, Slice
from tests import fakesysfs
from tests.fakesysfs import GiB, Gpu
from tests.models import smollm2

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[3]

#: A 7B-like model at its context: 32 blocks of 200 MiB, a 250 MiB head,
#: 16 MiB of KV per block.
SEVEN_B = ModelShape(n_layers=32, layer_bytes=200 * MiB, output_bytes=250 * MiB,
                     weight_bytes=6900 * MiB, kv_bytes_per_layer=16 * MiB,
                     compute_bytes=690 * MiB)
RESERVE = SEVEN_B.compute_bytes + pl.GPU_CONTEXT_BYTES


def with_cpus(root: Path, node_cpus: dict[int, str], cores: int) -> Path:
    """Give a fake tree `cores` processors and each NUMA node its cpulist."""
    fakesysfs.write(root / "proc" / "cpuinfo", "".join(
        f"processor\t: {i}\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse2 avx2\n"
        for i in range(cores)))
    for node, cpulist in node_cpus.items():
        fakesysfs.write(root / "sys" / "devices" / "system" / "node" / f"node{node}" / "cpulist",
                        cpulist + "\n")
    return root


def read_node_cpus(root: Path) -> dict[int, tuple[int, ...]]:
    """NUMA node -> its CPUs, from the tree's node*/cpulist."""
    directory = root / "sys" / "devices" / "system" / "node"
    found = {}
    for path in sorted(directory.glob("node*/cpulist")):
        found[int(path.parent.name[4:])] = pl.parse_cpulist(path.read_text())
    return found


def views(root: Path, config: TopologyConfig | None = None) -> list[PlaneView]:
    return pl.planes_from_topology(scan(root, config), read_node_cpus(root))


def two_gpu_box(root: Path) -> Path:
    """Two NVIDIA GPUs behind one switch on NUMA node 0; renderD128 is the
    one at the higher PCI address (render nodes need not follow PCI order)."""
    gpus = [Gpu(f"renderD{128 + i}", f"pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:0{i}.0/{a}",
                "0x10de", "0x2684", "nvidia", numa=0)
            for i, a in enumerate(["0000:41:00.0", "0000:03:00.0"])]
    return with_cpus(fakesysfs.build(root, gpus, numa=["10"]), {0: "0-7"}, 8)


TWO_GPU_CONFIG = TopologyConfig(devices={
    "drm-renderD128": DeviceConfig(memory_bytes=24 * GiB),
    "drm-renderD129": DeviceConfig(memory_bytes=24 * GiB)})


def four_gpu_box(root: Path) -> Path:
    return with_cpus(fakesysfs.four_gpu_box(root), {0: "0-7", 1: "8-15"}, 16)


def by_id(planes: list[PlaneView]) -> dict[str, PlaneView]:
    return {p.id: p for p in planes}


# the GGUF side ------------------------------------------------------------

#: SmolLM2-135M-Instruct's header, and its tensors' true sizes (read with the
#: gguf package): each block 2,216,448 bytes, token_embd (tied: the head)
#: 30,081,024, output_norm 2,304.
SMOLLM2 = {"general.architecture": "llama", "general.file_type": 3, "llama.block_count": 30,
           "llama.context_length": 8192, "llama.embedding_length": 576,
           "llama.feed_forward_length": 1536, "llama.attention.head_count": 9,
           "llama.attention.head_count_kv": 3, "llama.vocab_size": 49152}
SMOLLM2_SIZE = 98_362_432


def test_shape_from_gguf_bounds_the_true_sizes() -> None:
    shape = pl.shape_from_gguf(SMOLLM2, SMOLLM2_SIZE, n_ctx=2048, n_seq=4)
    assert shape.n_layers == 30 and not shape.exact
    # 4 x 2048 cells x 3 kv heads x (64 + 64) x 2 bytes
    assert shape.kv_bytes_per_layer == 4 * 2048 * 3 * 128 * 2
    assert 2_216_448 <= shape.layer_bytes < 1.5 * 2_216_448
    assert 30_081_024 + 2_304 <= shape.output_bytes <= SMOLLM2_SIZE
    assert shape.weight_bytes == SMOLLM2_SIZE
    assert shape.compute_bytes == leases.COMPUTE_MIN  # a tenth of 94 MiB is less
    # Llama.metadata gives every value as a string: the same shape.
    assert pl.shape_from_gguf({k: str(v) for k, v in SMOLLM2.items()}, SMOLLM2_SIZE,
                              n_ctx=2048, n_seq=4) == shape
    # Without the vocabulary size a block is bounded by the file / n_layer.
    bare = {k: v for k, v in SMOLLM2.items() if k != "llama.vocab_size"}
    assert pl.shape_from_gguf(bare, SMOLLM2_SIZE, n_ctx=2048).layer_bytes == \
        -(-SMOLLM2_SIZE // 30)
    # The lease for a CPU plane: file + KV + compute reserve, what runtimed's
    # leases ask for today.
    assert pl.estimated_bytes(shape) == SMOLLM2_SIZE + 30 * shape.kv_bytes_per_layer + \
        leases.COMPUTE_MIN
    assert pl.estimated_bytes(shape) == leases.need_bytes(SMOLLM2_SIZE, SMOLLM2, n_ctx=2048,
                                                          slots=4)
    assert pl.estimated_bytes(shape, kind="drm_gpu") == \
        pl.estimated_bytes(shape) + pl.GPU_CONTEXT_BYTES


#: Gemma 3 270M's header (no vocab_size: 262,144 tokens) and true sizes:
#: the largest block 3,995,648 bytes, token_embd (tied) 178,257,920 in Q8_0,
#: output_norm 2,560.
GEMMA3 = {"general.architecture": "gemma3", "general.file_type": 15,
          "gemma3.block_count": 18, "gemma3.context_length": 32768,
          "gemma3.embedding_length": 640, "gemma3.feed_forward_length": 2048,
          "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1,
          "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256}
GEMMA3_SIZE = 253_113_024


def test_shape_bounds_hold_without_the_vocabulary_size() -> None:
    shape = pl.shape_from_gguf(GEMMA3, GEMMA3_SIZE, n_ctx=1024)
    assert shape.layer_bytes >= 3_995_648
    assert 178_257_920 + 2_560 <= shape.output_bytes <= GEMMA3_SIZE
    assert shape.kv_bytes_per_layer == 1024 * 1 * (256 + 256) * 2


def test_shape_from_tensor_sizes_is_exact_and_quantized_kv_is_smaller() -> None:
    tensors = {f"blk.{i}.{n}": 1000 + i for i in range(30) for n in ("attn_q.weight",
                                                                     "ffn_up.weight")}
    tensors |= {"token_embd.weight": 30_081_024, "output_norm.weight": 2_304}
    shape = pl.shape_from_gguf(SMOLLM2, SMOLLM2_SIZE, n_ctx=512, tensor_bytes=tensors)
    assert shape.exact and shape.layer_bytes == 2 * 1029
    assert shape.output_bytes == 30_081_024 + 2_304  # tied: token_embd is the head
    q8 = pl.shape_from_gguf(SMOLLM2, SMOLLM2_SIZE, n_ctx=512, kv_type="q8_0")
    assert q8.kv_bytes_per_layer < pl.shape_from_gguf(SMOLLM2, SMOLLM2_SIZE,
                                                      n_ctx=512).kv_bytes_per_layer
    with pytest.raises(PlacementError, match="block_count"):
        pl.shape_from_gguf({"general.architecture": "llama"}, SMOLLM2_SIZE)
    with pytest.raises(PlacementError, match="KV cache type"):
        pl.shape_from_gguf(SMOLLM2, SMOLLM2_SIZE, kv_type="q2")


def test_parse_cpulist() -> None:
    assert pl.parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert pl.parse_cpulist("") == ()
    with pytest.raises(PlacementError):
        pl.parse_cpulist("zero")


def test_assign_follows_llama_cpp_counting() -> None:
    # All n_layer + 1 slots: every block and the head, the head on the last
    # device; slot i goes to the first device whose split point is above
    # i / 33, so device 0 takes slots 0-16 (16 / 33 < 0.5).
    assert pl.assign(32, 33, [0.5, 0.5]) == ([17, 15], 1)
    # k <= n_layer: the head and the last k - 1 blocks (older llama.cpp: k blocks).
    assert pl.assign(4, 2, [1.0]) == ([1], 0)
    assert pl.assign(4, 2, [1.0], output_counts=False) == ([2], None)
    # A device with no share gets nothing, whichever its position.
    assert pl.assign(8, 9, [0.0, 0.5, 0.0, 0.5]) == ([0, 5, 0, 3], 3)
    assert pl.assign(8, 0, [1.0]) == ([0], None)


# hosts --------------------------------------------------------------------


def test_cpu_only_host(tmp_path: Path) -> None:
    root = with_cpus(fakesysfs.build(tmp_path, [], numa=["10"]), {0: "0-7"}, 8)
    planes = views(root)
    assert [(p.id, p.kind, p.cpus) for p in planes] == [("cpu", "cpu", tuple(range(8)))]
    placed = pl.place(SEVEN_B, Grant.single("cpu", 8 * GiB), planes)
    assert (placed.n_gpu_layers, placed.split_mode, placed.tensor_split) == (0, "none", None)
    assert placed.n_threads == 8 and placed.cpu_affinity == tuple(range(8))
    assert placed.llama_kwargs() == {"n_gpu_layers": 0, "split_mode": 0, "main_gpu": 0,
                                     "n_threads": 8, "n_threads_batch": 8}
    # A GPU build in a CPU placement sees no device.
    assert placed.environment()["CUDA_VISIBLE_DEVICES"] == ""
    assert placed.layers == (("host", 32),) and "CPU lease" in placed.why


def test_cpu_plane_threads_follow_its_numa_node_when_it_has_one() -> None:
    planes = [PlaneView(id="cpu", kind="cpu", device_index=None, numa_node=1, cpus=(4, 5))]
    placed = pl.place(SEVEN_B, Grant.single("cpu", GiB), planes)
    assert (placed.n_threads, placed.cpu_affinity) == (2, (4, 5))
    assert "NUMA node 1" in placed.why


def test_one_gpu_holds_the_whole_model(tmp_path: Path) -> None:
    root = with_cpus(fakesysfs.nvidia_box(tmp_path), {0: "0-3"}, 4)
    planes = views(root, TopologyConfig(devices={
        "drm-renderD128": DeviceConfig(memory_bytes=24 * GiB)}))
    gpu = by_id(planes)["drm-renderD128"]
    assert (gpu.device_index, gpu.numa_node, gpu.cpus) == (0, 0, (0, 1, 2, 3))
    lease = pl.estimated_bytes(SEVEN_B, kind="drm_gpu")
    placed = pl.place(SEVEN_B, Grant.single("drm-renderD128", lease), planes)
    assert placed.n_gpu_layers == 33  # n_layer + 1: every block and the output head
    assert (placed.main_gpu, placed.split_mode, placed.tensor_split) == (0, "none", None)
    assert placed.layers == (("drm-renderD128", 32),)
    assert placed.output_on == "drm-renderD128"
    assert (placed.n_threads, placed.cpu_affinity) == (4, (0, 1, 2, 3))
    assert placed.environment() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                    "CUDA_VISIBLE_DEVICES": "0"}
    assert "all 32 layers and the output head on GPU" in placed.why


def test_an_nvidia_gpu_without_a_render_node_is_placed_as_a_gpu() -> None:
    """A VM's NVIDIA GPU (inferenced's kind nvidia_gpu: /dev/nvidiaN, no DRM
    node) holds layers as a render node's GPU would; with no PCI path known
    it is numbered by id and not pinned."""
    planes = [PlaneView(id="nvidia-0", kind="nvidia_gpu", device_index=0, numa_node=None,
                        cpus=()),
              PlaneView(id="cpu", kind="cpu", device_index=None, numa_node=None,
                        cpus=(0, 1, 2, 3))]
    lease = pl.estimated_bytes(SEVEN_B, kind="nvidia_gpu")
    assert lease == pl.estimated_bytes(SEVEN_B, kind="drm_gpu")  # the backend's context too
    placed = pl.place(SEVEN_B, Grant.single("nvidia-0", lease), planes)
    assert placed.n_gpu_layers == 33 and placed.main_gpu == 0
    assert placed.layers == (("nvidia-0", 32),)


def test_one_gpu_too_small_gives_a_hybrid_split(tmp_path: Path) -> None:
    root = with_cpus(fakesysfs.amd_box(tmp_path), {0: "0-3"}, 4)
    planes = views(root)
    placed = pl.place(SEVEN_B, Grant.single("drm-renderD128", 4 * GiB), planes)
    # 4096 - 690 - 512 = 2894 MiB: the head (250) and 12 blocks with their KV
    # (12 x 216) under llama.cpp's counting, 13 blocks (13 x 216) under the
    # older one: both fit at 13 slots, not at 14.
    assert placed.n_gpu_layers == 13
    assert placed.layers == (("drm-renderD128", 12), ("host", 20))
    assert placed.split_mode == "none" and placed.main_gpu == 0
    assert "hybrid" in placed.why
    usable = 4 * GiB - RESERVE
    assert 12 * (200 + 16) * MiB + 250 * MiB <= usable < 13 * (200 + 16) * MiB + 250 * MiB


def test_two_gpus_pipeline_and_tensor(tmp_path: Path) -> None:
    planes = views(two_gpu_box(tmp_path), TWO_GPU_CONFIG)
    index = {p.id: p.device_index for p in planes if p.kind == "drm_gpu"}
    assert index == {"drm-renderD128": 1, "drm-renderD129": 0}  # PCI address order
    slices = [Slice(plane_id="drm-renderD128", memory_bytes=8 * GiB, role="pipeline",
                    stage_index=0),
              Slice(plane_id="drm-renderD129", memory_bytes=4 * GiB + RESERVE,
                    role="pipeline", stage_index=1)]
    placed = pl.place(SEVEN_B, Grant.from_slices(slices), planes)
    assert placed.split_mode == "layer" and placed.n_gpu_layers == 33
    assert placed.main_gpu == 1  # stage 0's device
    assert placed.devices == (1, 0)
    assert placed.tensor_split is not None
    usable = [8 * GiB - RESERVE, 4 * GiB]
    assert placed.tensor_split == pytest.approx([usable[1] / sum(usable),
                                                 usable[0] / sum(usable)])
    kwargs = placed.llama_kwargs()
    assert kwargs["split_mode"] == 1 and kwargs["main_gpu"] == 1
    assert kwargs["tensor_split"] == list(placed.tensor_split)
    # Only the gang visible, in stage order: stage 0 is device 0 there.
    masked = placed.llama_kwargs(masked=True)
    assert masked["main_gpu"] == 0
    assert masked["tensor_split"] == [placed.tensor_split[1], placed.tensor_split[0]]
    assert placed.environment()["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert sum(n for _, n in placed.layers) == 32 and ("host", 0) not in placed.layers
    assert (placed.n_threads, placed.cpu_affinity) == (8, tuple(range(8)))

    def tensor(memory: int) -> pl.Placement:
        return pl.place(SEVEN_B, Grant.from_slices(
            [Slice(plane_id=s.plane_id, memory_bytes=memory, role="tensor") for s in slices]),
            planes)

    # Each device holds half of every matrix: 2 x 3918 MiB of room hold the
    # 6650 MiB of weights and the KV.
    row = tensor(5 * GiB)
    assert row.split_mode == "row" and row.llama_kwargs()["split_mode"] == 2
    assert row.main_gpu == 1  # the first slice's device
    assert row.tensor_split == pytest.approx([0.5, 0.5])
    assert row.n_gpu_layers == 33
    # 2 x 2894 MiB do not: some layers stay on the host.
    assert 0 < tensor(4 * GiB).n_gpu_layers < 33


def test_four_gpus_over_two_numa_nodes(tmp_path: Path) -> None:
    root = four_gpu_box(tmp_path)
    topology = scan(root)
    planes = pl.planes_from_topology(topology, read_node_cpus(root))
    index = {p.id: p.device_index or 0 for p in planes if p.kind == "drm_gpu"}
    assert index == {"drm-renderD128": 0, "drm-renderD129": 1, "drm-renderD130": 2,
                     "drm-renderD131": 3}
    # A pipeline on the far NUMA node's pair: zeros for the other two devices,
    # threads on node 1's cores.
    far = [Slice(plane_id="drm-renderD131", memory_bytes=8 * GiB, role="pipeline",
                 stage_index=0),
           Slice(plane_id="drm-renderD130", memory_bytes=8 * GiB, role="pipeline",
                 stage_index=1)]
    placed = pl.place(SEVEN_B, Grant.from_slices(far), planes)
    assert placed.tensor_split is not None
    assert placed.tensor_split == pytest.approx([0.0, 0.0, 0.5, 0.5])
    assert placed.tensor_split[:2] == (0.0, 0.0)
    assert placed.main_gpu == 3 and placed.devices == (3, 2)
    assert (placed.n_threads, placed.cpu_affinity) == (8, tuple(range(8, 16)))
    assert "NUMA node 1" in placed.why

    # The gang inferenced would choose for four pipeline stages (the shortest
    # chain), with unequal slices: shares follow each slice's room.
    gpus = [p for p in topology.planes if p.kind == "drm_gpu"]
    chain = choose(gpus, 4, topology.numa_distances, pipeline=True)
    assert chain is not None
    memory = [3 * GiB, 4 * GiB, 5 * GiB, 6 * GiB]
    gang = Grant.from_slices(Slice(plane_id=p.id, memory_bytes=m, role="pipeline",
                                   stage_index=i)
                             for i, (p, m) in enumerate(zip(chain, memory, strict=True)))
    placed = pl.place(SEVEN_B, gang, planes)
    assert placed.main_gpu == index[chain[0].id]
    assert placed.tensor_split is not None and len(placed.tensor_split) == 4
    room = {p.id: m - RESERVE for p, m in zip(chain, memory, strict=True)}
    for plane_id, device in index.items():
        assert placed.tensor_split[device] == pytest.approx(room[plane_id] / sum(room.values()))
    assert placed.n_gpu_layers == 33
    near = by_id(planes)[chain[0].id].numa_node
    assert placed.cpu_affinity == ((0, 1, 2, 3, 4, 5, 6, 7) if near == 0 else
                                   tuple(range(8, 16)))

    # Row split over all four, in the order given: main_gpu is the first's.
    row = pl.place(SEVEN_B, Grant.from_slices(
        Slice(plane_id=f"drm-renderD{n}", memory_bytes=4 * GiB, role="tensor")
        for n in (130, 128, 129, 131)), planes)
    assert row.split_mode == "row" and row.main_gpu == 2
    assert row.tensor_split == pytest.approx([0.25] * 4)


def test_a_cpu_slice_in_a_pipeline_holds_the_host_layers(tmp_path: Path) -> None:
    planes = views(four_gpu_box(tmp_path))
    placed = pl.place(SEVEN_B, Grant.from_slices([
        Slice(plane_id="drm-renderD128", memory_bytes=3 * GiB, role="pipeline",
              stage_index=1),
        Slice(plane_id="cpu", memory_bytes=8 * GiB, role="pipeline", stage_index=0)]), planes)
    assert placed.split_mode == "none" and placed.main_gpu == 0
    assert 0 < placed.n_gpu_layers < 33 and placed.layers[-1][0] == "host"


# errors -------------------------------------------------------------------


@pytest.mark.parametrize(("slices", "message"), [
    ([Slice(plane_id="drm-renderD999", memory_bytes=GiB)], "unknown plane"),
    ([Slice(plane_id="drm-renderD128", memory_bytes=0)], "of 0 bytes"),
    ([Slice(plane_id="drm-renderD128", memory_bytes=4 * GiB, role="tensor"),
      Slice(plane_id="cpu", memory_bytes=4 * GiB, role="tensor")], "CPU slice in a tensor"),
    ([Slice(plane_id="drm-renderD128", memory_bytes=4 * GiB, role="tensor"),
      Slice(plane_id="drm-renderD129", memory_bytes=4 * GiB, role="pipeline")],
     "one role for all"),
    ([Slice(plane_id="drm-renderD128", memory_bytes=4 * GiB, role="expert")],
     "pipeline or tensor"),
    ([Slice(plane_id="drm-renderD128", memory_bytes=4 * GiB, stage_index=0),
      Slice(plane_id="drm-renderD129", memory_bytes=4 * GiB, stage_index=0)], "repeat"),
    ([Slice(plane_id="drm-renderD128", memory_bytes=4 * GiB),
      Slice(plane_id="drm-renderD128", memory_bytes=4 * GiB)], "two slices on plane"),
    ([Slice(plane_id="drm-renderD128", memory_bytes=4 * GiB),
      Slice(plane_id="drm-renderD129", memory_bytes=RESERVE + 10 * MiB)], "holds no layer"),
    ([Slice(plane_id="drm-renderD128", memory_bytes=RESERVE)], "below the"),
])
def test_impossible_grants(tmp_path: Path, slices: list[Slice], message: str) -> None:
    planes = views(four_gpu_box(tmp_path))
    with pytest.raises(PlacementError, match=message):
        pl.place(SEVEN_B, Grant.from_slices(slices), planes)


def test_impossible_single_leases(tmp_path: Path) -> None:
    planes = views(four_gpu_box(tmp_path))
    with pytest.raises(PlacementError, match="of -1 bytes"):
        pl.place(SEVEN_B, Grant.single("drm-renderD128", -1), planes)
    # Room for a block but not for the head llama.cpp offloads first.
    with pytest.raises(PlacementError, match="first slot"):
        pl.place(SEVEN_B, Grant.single("drm-renderD128", RESERVE + 220 * MiB), planes)
    npu = [*planes, PlaneView(id="accel-accel0", kind="npu", device_index=None, numa_node=0)]
    with pytest.raises(PlacementError, match="NPU"):
        pl.place(SEVEN_B, Grant.single("accel-accel0", 4 * GiB), npu)
    with pytest.raises(PlacementError, match="without slices"):
        pl.place(SEVEN_B, Grant(slices=()), planes)
    with pytest.raises(PlacementError):
        ModelShape(n_layers=0, layer_bytes=1, output_bytes=1, weight_bytes=1,
                   kv_bytes_per_layer=1, compute_bytes=1)


# any grant ----------------------------------------------------------------

GPUS = [PlaneView(id=f"g{i}", kind="drm_gpu", device_index=i, numa_node=i // 2,
                  cpus=tuple(range(4 * (i // 2), 4 * (i // 2) + 4))) for i in range(4)]
CPU = PlaneView(id="cpu", kind="cpu", device_index=None, numa_node=None, cpus=tuple(range(8)))


@st.composite
def cases(draw: st.DrawFn) -> tuple[ModelShape, Grant]:
    n_layers = draw(st.integers(1, 96))
    layer = draw(st.integers(1, 800)) * MiB
    output = draw(st.integers(0, 1200)) * MiB
    shape = ModelShape(n_layers=n_layers, layer_bytes=layer, output_bytes=output,
                       weight_bytes=n_layers * layer + output + draw(st.integers(0, 500)) * MiB,
                       kv_bytes_per_layer=draw(st.integers(0, 256)) * MiB,
                       compute_bytes=draw(st.integers(64, 2048)) * MiB)
    count = draw(st.integers(1, 4))
    chosen = draw(st.permutations(GPUS))[:count]
    role = draw(st.sampled_from(["pipeline", "tensor"]))
    # Room beside the reserve for some layers (from none to the model twice
    # over) and some bytes more; now and then less than the reserve.
    reserve = shape.compute_bytes + pl.GPU_CONTEXT_BYTES
    per_layer = layer + shape.kv_bytes_per_layer
    slices = [Slice(plane_id=p.id, memory_bytes=max(1, reserve + draw(
                        st.integers(-1, 2 * n_layers)) * per_layer + draw(
                        st.integers(0, 2048)) * MiB),
                    role=role, stage_index=i if role == "pipeline" else None)
              for i, p in enumerate(chosen)]
    grant = Grant.single(slices[0].plane_id, slices[0].memory_bytes) if count == 1 and \
        draw(st.booleans()) else Grant.from_slices(slices)
    return shape, grant


def device_bytes(shape: ModelShape, placed: pl.Placement, split: list[float],
                 output_counts: bool) -> list[int]:
    """What each device (in `split`'s order) holds under llama.cpp's cut."""
    blocks, output = pl.assign(shape.n_layers, placed.n_gpu_layers, split,
                               output_counts=output_counts)
    everything = sum(blocks) == shape.n_layers and output is not None
    held = []
    for device, n in enumerate(blocks):
        weights = n * shape.layer_bytes + (shape.output_bytes if output == device else 0)
        if placed.split_mode == "row":
            total = sum(blocks) * shape.layer_bytes + \
                (shape.output_bytes if output is not None else 0)
            if everything:
                total = min(total, shape.weight_bytes)
            weights = math.ceil(total * split[device] / sum(split))
        elif everything and len(split) == 1:
            weights = min(weights, shape.weight_bytes)
        held.append(int(weights) + n * shape.kv_bytes_per_layer)
    return held


@settings(max_examples=300, deadline=None)
@given(cases())
def test_no_device_is_given_more_than_its_slice(case: tuple[ModelShape, Grant]) -> None:
    shape, grant = case
    try:
        placed = pl.place(shape, grant, [*GPUS, CPU])
    except PlacementError:
        event("refused")
        return
    event("every slot offloaded" if placed.n_gpu_layers > shape.n_layers else "hybrid")
    memory = {s.plane_id: s.memory_bytes for s in grant.slices}
    reserve = shape.compute_bytes + pl.GPU_CONTEXT_BYTES
    assert 1 <= placed.n_gpu_layers <= shape.n_layers + 1
    number = {p.device_index: p.id for p in GPUS}
    if placed.tensor_split is None:
        orders = [[placed.main_gpu]]
        splits = [[1.0]]
    else:
        assert all(share >= 0 for share in placed.tensor_split)
        assert sum(placed.tensor_split) == pytest.approx(1.0)
        assert {d for d, share in enumerate(placed.tensor_split) if share > 0} == \
            set(placed.devices)
        numbered = sorted(placed.devices)
        orders = [numbered, list(placed.devices)]  # unmasked, masked
        splits = [[placed.tensor_split[d] for d in order] for order in orders]
    for order, split in zip(orders, splits, strict=True):
        for output_counts in (True, False):
            for device, held in zip(order, device_bytes(shape, placed, split, output_counts),
                                    strict=True):
                assert held + reserve <= memory[number[device]]
    # As many as fit: one slot more would not (unless every slot is there).
    if placed.n_gpu_layers <= shape.n_layers:
        more = dataclasses.replace(placed, n_gpu_layers=placed.n_gpu_layers + 1)
        assert any(
            held + reserve > memory[number[device]]
            for order, split in zip(orders, splits, strict=True)
            for output_counts in (True, False)
            for device, held in zip(order, device_bytes(shape, more, split, output_counts),
                                    strict=True))


# the benchmark's dry run --------------------------------------------------


def test_gpu_offload_dry_run_prints_the_placement() -> None:
    model = smollm2()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_offload.py"), "--dry-run",
                           "--model", str(model)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "placement:" in out and "n_gpu_layers" in out and "llama kwargs" in out
    if "no GPU found" in out:
        assert "n_gpu_layers=0" in out and "CPU lease" in out
