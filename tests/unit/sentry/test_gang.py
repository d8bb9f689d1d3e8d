"""Gang triage's classifier and plane choice, on real-format kernel and
journal lines (amdgpu, NVIDIA Xid, i915, AER, CUDA/HIP allocation)."""

import pytest

from syntrop.sentry import gang
from syntrop.sentry.gang import DRIVER_HANG, INTERCONNECT, VRAM_EXHAUSTED, Plane

#: Two PCIe switches, two GPUs behind each (tests/fakesysfs.py four_gpu_box).
PLANES = [
    Plane(id="drm-renderD128", chain=("0000:00:01.0", "0000:01:00.0", "0000:02:00.0",
                                      "0000:03:00.0")),
    Plane(id="drm-renderD129", chain=("0000:00:01.0", "0000:01:00.0", "0000:02:01.0",
                                      "0000:04:00.0")),
    Plane(id="drm-renderD130", chain=("0000:80:01.0", "0000:81:00.0", "0000:82:00.0",
                                      "0000:83:00.0")),
    Plane(id="drm-renderD131", chain=("0000:80:01.0", "0000:81:00.0", "0000:82:01.0",
                                      "0000:84:00.0")),
    Plane(id="cpu"),
]

AMDGPU_RING = ("amdgpu 0000:03:00.0: [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 "
               "timeout, signaled seq=5021, emitted seq=5023")
AMDGPU_NO_ADDRESS = "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring sdma0 timeout, signaled seq=1"
XID_HANG = ("NVRM: Xid (PCI:0000:83:00): 109, pid=4242, name=python3, Ch 00000008, errorString "
            "CTX SWITCH TIMEOUT, Info 0x2c001")
XID_BUS = "NVRM: Xid (PCI:0000:84:00): 79, pid=1133, GPU has fallen off the bus."
XID_APP = "NVRM: Xid (PCI:0000:83:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"
I915 = "i915 0000:04:00.0: [drm] GPU HANG: ecode 12:1:85dffffb, in python3 [4242]"
AER_PORT = "pcieport 0000:80:01.0: AER: Uncorrected (Fatal) error received: 0000:80:01.0"
AER_SOURCE = ("pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: "
              "0000:04:00.0")
AER_BUS = ("amdgpu 0000:03:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
           "type=Transaction Layer, (Requester ID)")
AER_CORRECTED = "pcieport 0000:00:01.0: AER: Corrected error received: 0000:03:00.0"
AMDGPU_CS_OOM = ("amdgpu 0000:03:00.0: [drm:amdgpu_cs_ioctl [amdgpu]] *ERROR* Not enough memory "
                 "for command submission!")
CUDA_OOM = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8192.00 MiB on device 0: "
            "cudaMalloc failed: out of memory")
TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
             "total capacity of 23.64 GiB of which 1.02 GiB is free.")


@pytest.mark.parametrize("line, kind, device", [
    (AMDGPU_RING, DRIVER_HANG, "0000:03:00.0"),
    ("kernel: GPU error: " + AMDGPU_RING, DRIVER_HANG, "0000:03:00.0"),  # contextd's summary
    (AMDGPU_NO_ADDRESS, DRIVER_HANG, None),
    (XID_HANG, DRIVER_HANG, "0000:83:00"),
    (XID_BUS, INTERCONNECT, "0000:84:00"),
    (I915, DRIVER_HANG, "0000:04:00.0"),
    (AER_PORT, INTERCONNECT, "0000:80:01.0"),
    (AER_SOURCE, INTERCONNECT, "0000:04:00.0"),
    (AER_BUS, INTERCONNECT, "0000:03:00.0"),
    (AMDGPU_CS_OOM, VRAM_EXHAUSTED, "0000:03:00.0"),
    (CUDA_OOM, VRAM_EXHAUSTED, None),
    (TORCH_OOM, VRAM_EXHAUSTED, None),
])
def test_classify_real_lines(line: str, kind: str, device: str | None) -> None:
    fault = gang.classify_line(line)
    assert fault is not None and (fault.kind, fault.device) == (kind, device)


@pytest.mark.parametrize("line", [
    AER_CORRECTED, XID_APP, "web: cannot bind 0.0.0.0:80", "",
    "amdgpu 0000:03:00.0: amdgpu: SMU is initialized successfully!",
    "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/system.slice/db.service,task=db,pid=9",
])
def test_classify_leaves_the_rest(line: str) -> None:
    assert gang.classify_line(line) is None


def test_driver_hang_quarantines_that_plane_only() -> None:
    verdict = gang.judge(gang.classify([AMDGPU_RING, AMDGPU_RING]), PLANES)
    assert list(verdict.quarantine) == ["drm-renderD128"]
    assert verdict.quarantine["drm-renderD128"].startswith("driver hang at 0000:03:00.0: ")
    assert verdict.healthy == ["drm-renderD129", "drm-renderD130", "drm-renderD131", "cpu"]
    assert len(verdict.faults) == 1


def test_nvidia_xid_names_bus_and_slot() -> None:
    verdict = gang.judge(gang.classify([XID_HANG, XID_BUS]), PLANES)
    assert verdict.quarantine.keys() == {"drm-renderD130", "drm-renderD131"}
    assert verdict.quarantine["drm-renderD131"].startswith("interconnect fault at 0000:84:00")


def test_aer_on_a_port_takes_every_plane_below_it() -> None:
    verdict = gang.judge(gang.classify([AER_PORT]), PLANES)
    assert verdict.quarantine.keys() == {"drm-renderD130", "drm-renderD131"}
    assert verdict.healthy == ["drm-renderD128", "drm-renderD129", "cpu"]


def test_aer_naming_its_source_takes_that_device_only() -> None:
    verdict = gang.judge(gang.classify([AER_SOURCE, AER_CORRECTED]), PLANES)
    assert list(verdict.quarantine) == ["drm-renderD129"]


def test_vram_exhaustion_quarantines_nothing() -> None:
    verdict = gang.judge(gang.classify([AMDGPU_CS_OOM, CUDA_OOM]), PLANES)
    assert verdict.quarantine == {} and len(verdict.healthy) == 5
    assert [f.kind for f in verdict.faults] == [VRAM_EXHAUSTED, VRAM_EXHAUSTED]
    assert "the plane is healthy, not quarantined" in verdict.summary()


def test_mixed_faults_each_to_their_plane() -> None:
    verdict = gang.judge(gang.classify([CUDA_OOM, I915, AMDGPU_RING]), PLANES)
    assert verdict.quarantine.keys() == {"drm-renderD128", "drm-renderD129"}
    summary = verdict.summary()
    assert summary.startswith("faults: driver_hang, vram_exhausted; serving: drm-renderD130, "
                              "drm-renderD131, cpu; quarantine drm-renderD128 (driver hang")


def test_a_fault_naming_no_known_plane_quarantines_nothing() -> None:
    verdict = gang.judge(gang.classify([AMDGPU_NO_ADDRESS,
                                        AMDGPU_RING.replace("03:00.0", "09:00.0")]), PLANES)
    assert verdict.quarantine == {}
    assert "driver_hang names no known plane: nothing quarantined" in verdict.summary()
    assert "driver_hang names no known plane (0000:09:00.0)" in verdict.summary()


def test_no_faults_says_so() -> None:
    assert gang.judge([], PLANES).summary() == \
        "no GPU, interconnect or VRAM fault in the context"


def test_contextd_pcie_events_reach_gang_triage() -> None:
    """contextd records AER lines as kernel events of class pcie; their
    summaries are what sentry reads, and they place the fault as the raw
    line does (corrected errors are still no fault)."""
    from syntrop.contextd.kernel import classify as kernel_class

    raw = "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0"
    event = kernel_class(raw)
    assert event is not None and event.action == "pcie"
    fault = gang.classify_line(event.summary)
    assert fault is not None and fault.kind == INTERCONNECT
    assert (fault.device, fault.port) == ("0000:01:00.0", False)
    corrected = kernel_class("pcieport 0000:00:01.0: AER: Corrected error received: "
                             "0000:01:00.0")
    assert corrected is not None and gang.classify_line(corrected.summary) is None
