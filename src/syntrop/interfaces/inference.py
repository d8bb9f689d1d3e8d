"""io.syntrop.Inference1: compute planes, priority leases, pressure.

Given field by field by the seed (000_*.txt). Additions are only nullable
fields and new methods, after the seed's own.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypedDict

from asyncvarlink import FileDescriptor, TypedVarlinkErrorReply

from syntrop.interfaces import names
from syntrop.varlink.authz import not_authorized
from syntrop.varlink.contract import Interface, method

NAME = names.INFERENCE


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputePlane:
    """A device work can be placed on: a GPU render node, an NPU, or the CPU
    with host RAM.

    Fields:
        id: Stable identifier, e.g. drm-renderD128, accel-accel0, nvidia-0
            or cpu.
        name: Human name of the device, e.g. the GPU's marketing name.
        kind: One of drm_gpu, nvidia_gpu (an NVIDIA GPU with no DRM render
            node, found by its /dev/nvidiaN and nvidia-smi), npu, cpu.
        total_memory: Bytes of memory the plane has (VRAM, or host RAM for cpu).
        available_memory: Bytes free on the device minus what leases hold.
        is_triage_reserved: Whether the plane (or a slice of it) is kept for
            EmergencyTriage leases.
        quarantined: Set when sentry quarantined the plane: it gets no new
            leases. Null when the plane is healthy.
    """

    id: str
    name: str
    kind: str
    total_memory: int
    available_memory: int
    is_triage_reserved: bool
    quarantined: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseInfo:
    """A lease as ListLeases shows it.

    Fields:
        id: Lease identifier.
        plane_id: The plane the lease holds memory on.
        allocated_memory: Bytes held.
        priority: EmergencyTriage, Interactive or Batch.
        state: active, frozen (preempted by an emergency) or released.
        client_unit: The systemd unit whose cgroup is frozen on preemption.
        client_pid: The process the lease lives and dies with.
        exclusive: An EmergencyTriage lease holding its plane's compute:
            every lower-priority lease there is frozen while it lives.
    """

    id: str
    plane_id: str
    allocated_memory: int
    priority: str
    state: str
    client_unit: str | None
    client_pid: int | None
    exclusive: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaneSlice:
    """One member of a gang (composite) lease.

    Fields:
        plane_id: The plane; empty to let inferenced place it by affinity.
        role: pipeline (ordered stages) or tensor (tightest group).
        stage_index: Position of a pipeline stage; null for tensor slices.
        memory_bytes: Bytes wanted on that plane.
    """

    plane_id: str
    role: str
    stage_index: int | None
    memory_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CompositeLease:
    """A gang lease: every slice granted together or none.

    Fields:
        lease_id: Lease identifier.
        gang_id: The caller's name for the gang.
        gang_policy: all-or-nothing.
        slices: The granted slices with their planes.
    """

    lease_id: str
    gang_id: str
    gang_policy: str
    slices: list[PlaneSlice]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfo:
    """A model known to inferenced and where it would run.

    Fields:
        id: Model identifier.
        format: File format, e.g. gguf.
        path: Where the weights are.
        estimated_memory: Bytes the model needs resident.
        placement: The plane or planes the model fits, comma-separated.
    """

    id: str
    format: str
    path: str
    estimated_memory: int
    placement: str


class GetTopologyResult(TypedDict):
    planes: list[ComputePlane]
    total_ram: int
    available_ram: int
    cpu_cores: int


class GetPressureResult(TypedDict):
    level: str
    cpu_some: float
    memory_some: float
    io_some: float


class AcquireLeaseResult(TypedDict):
    lease_id: str
    plane_id: str
    allocated_memory: int


class AcquireCompositeLeaseResult(TypedDict):
    lease_id: str
    allocated_slices: list[PlaneSlice]


class AcquireBufferResult(TypedDict):
    buffer: FileDescriptor
    size: int


class MethodNotFound(TypedVarlinkErrorReply, interface=NAME):
    """The method is not part of this interface.

    Parameters:
        method: The method name that was called.
    """

    class Parameters:
        method: str


class InvalidParameter(TypedVarlinkErrorReply, interface=NAME):
    """A parameter has a value the method cannot accept (an unknown priority,
    a negative or absurd size, a duplicate plane).

    Parameters:
        parameter: Name of the offending parameter.
    """

    class Parameters:
        parameter: str


class ResourceExhaustion(TypedVarlinkErrorReply, interface=NAME):
    """Nothing fits and nothing of lower priority can be preempted.

    Parameters:
        plane: The plane that came closest, or the one asked for.
        requested: Bytes asked for.
        available: Bytes that could be had.
    """

    class Parameters:
        plane: str
        requested: int
        available: int


class PlaneNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No plane has this identifier.

    Parameters:
        plane: The identifier asked for.
    """

    class Parameters:
        plane: str


class LeaseNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No live lease has this identifier.

    Parameters:
        lease_id: The identifier asked for.
    """

    class Parameters:
        lease_id: str


class ModelNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No model is registered under this identifier.

    Parameters:
        model: The identifier asked for.
    """

    class Parameters:
        model: str


class PressureTooHigh(TypedVarlinkErrorReply, interface=NAME):
    """The host is under pressure and leases of this priority are refused
    until it eases (EmergencyTriage is never refused for pressure).

    Parameters:
        resource: cpu, memory or io.
        level: elevated or critical.
        priority: The refused priority.
    """

    class Parameters:
        resource: str
        level: str
        priority: str


class PlaneQuarantined(TypedVarlinkErrorReply, interface=NAME):
    """The plane is quarantined and takes no new leases.

    Parameters:
        plane: The plane.
        reason: Why sentry quarantined it.
    """

    class Parameters:
        plane: str
        reason: str


class RuntimeUnavailable(TypedVarlinkErrorReply, interface=NAME):
    """Inference could not be forwarded to runtimed.

    Parameters:
        reason: What failed.
    """

    class Parameters:
        reason: str


NotAuthorized = not_authorized(NAME)


class Inference1(Interface, name=NAME):
    """Hardware compute discovery, multi-accelerator lease arbitration, PSI
    telemetry, and streaming model inference."""

    errors = (
        MethodNotFound,
        InvalidParameter,
        ResourceExhaustion,
        PlaneNotFound,
        LeaseNotFound,
        ModelNotFound,
        PressureTooHigh,
        PlaneQuarantined,
        RuntimeUnavailable,
        NotAuthorized,
    )

    @method
    def GetTopology(self) -> GetTopologyResult:
        """Describe the compute planes of this host.

        Returns:
            planes: GPUs, NPUs and the CPU plane.
            total_ram: Bytes of host RAM.
            available_ram: Bytes of host RAM available (MemAvailable).
            cpu_cores: Online CPU cores.
        """

    @method
    def GetPressure(self) -> GetPressureResult:
        """Report pressure stall information (PSI) of the host.

        Returns:
            level: normal, elevated or critical.
            cpu_some: avg10 of "some" CPU pressure, percent.
            memory_some: avg10 of "some" memory pressure, percent.
            io_some: avg10 of "some" I/O pressure, percent.
        """

    @method
    def AcquireLease(
        self,
        *,
        priority: str,
        memory_bytes: int,
        plane: str | None,
        unit: str | None,
        pid: int | None,
        exclusive: bool | None = None,
    ) -> AcquireLeaseResult:
        """Lease memory on a plane. EmergencyTriage preempts (freezes)
        Interactive and Batch leases when it must.

        Parameters:
            priority: EmergencyTriage (100), Interactive (10) or Batch (0).
            memory_bytes: Bytes wanted.
            plane: A plane identifier; null to place on the best fitting one.
            unit: The systemd unit whose cgroup is frozen on preemption.
            pid: The process the lease lives and dies with; defaults to the
                caller.
            exclusive: EmergencyTriage only: also take the plane's compute,
                freezing every Interactive and Batch lease on it (memory or
                not) until this one ends. Other priorities: InvalidParameter.

        Returns:
            lease_id: Lease identifier.
            plane_id: The plane the lease was placed on.
            allocated_memory: Bytes granted.
        """

    @method
    def AcquireCompositeLease(
        self,
        *,
        gang_id: str,
        slices: list[PlaneSlice],
        gang_policy: str,
        priority: str,
        client_unit: str | None,
    ) -> AcquireCompositeLeaseResult:
        """Lease several planes at once, all or nothing.

        Parameters:
            gang_id: The caller's name for the gang.
            slices: The slices wanted; slices without a plane are placed by
                PCIe and NUMA affinity.
            gang_policy: all-or-nothing.
            priority: EmergencyTriage, Interactive or Batch.
            client_unit: The systemd unit whose cgroup is frozen on preemption.

        Returns:
            lease_id: Lease identifier.
            allocated_slices: The slices with their planes.
        """

    @method
    def ReleaseLease(self, *, lease_id: str) -> None:
        """Give a lease back.

        Parameters:
            lease_id: The lease.
        """

    @method
    def Yield(self, *, lease_id: str) -> None:
        """Give a lease up voluntarily so higher priority work can run.

        Parameters:
            lease_id: The lease.
        """

    @method
    def Freeze(self, *, lease_id: str) -> None:
        """Freeze the processes of a lease through the cgroup v2 freezer.
        Allowed to root and to the lease's owner.

        Parameters:
            lease_id: The lease.
        """

    @method
    def Thaw(self, *, lease_id: str) -> None:
        """Thaw a frozen lease. Allowed to root and to the lease's owner.

        Parameters:
            lease_id: The lease.
        """

    @method(return_parameter="leases")
    def ListLeases(self) -> list[LeaseInfo]:
        """List the live leases.

        Returns:
            leases: Every lease, active or frozen.
        """

    @method(return_parameter="leases")
    def ListCompositeLeases(self) -> list[CompositeLease]:
        """List the live gang leases.

        Returns:
            leases: Every composite lease.
        """

    @method(return_parameter="models")
    def ListModels(self) -> list[ModelInfo]:
        """List the registered models with their placement.

        Returns:
            models: Every registered model.
        """

    @method
    def RegisterModel(self, *, id: str, format: str, path: str, estimated_bytes: int) -> None:
        """Register a model so leases and placement know its size.

        Parameters:
            id: Model identifier.
            format: File format, e.g. gguf.
            path: Where the weights are.
            estimated_bytes: Bytes the model needs resident.
        """

    @method(return_parameter="chunk")
    def StreamInference(self, *, model: str, prompt: str) -> AsyncIterator[str]:
        """Run a prompt under an Interactive lease and stream the answer.
        Call with "more".

        Parameters:
            model: Model identifier.
            prompt: The prompt.

        Returns:
            chunk: The next piece of generated text.
        """

    @method
    def AcquireBuffer(self, *, lease_id: str) -> AcquireBufferResult:
        """Get the host-RAM buffer of a cpu-plane lease: a memfd of the
        allocated size, sealed against shrinking and growing, passed with the
        reply (SCM_RIGHTS).

        Parameters:
            lease_id: A lease on the cpu plane.

        Returns:
            buffer: Index of the passed file descriptor.
            size: Size of the buffer in bytes.
        """

    @method
    def Quarantine(self, *, plane: str, reason: str) -> None:
        """Take a plane out of service: it gets no new leases. For sentry's
        gang triage.

        Parameters:
            plane: The plane.
            reason: Why, in words shown by GetTopology.
        """

    @method
    def Unquarantine(self, *, plane: str) -> None:
        """Return a quarantined plane to service.

        Parameters:
            plane: The plane.
        """
