"""Every resident model holds an inferenced lease for the memory it needs.

Before a worker loads a model, runtimed asks inferenced (Inference1
.AcquireLease) for the model's memory on the plane it runs on, for the
worker's pid, at the priority of its lane: Interactive for the models that
serve chat, completions and batches, EmergencyTriage for the triage lane
(sentry's requests, served by a worker of their own so that freezing the
others never stops them). The lease ends when the worker does: released on
unload, and dropped by inferenced itself when the pid dies (a crash).

What a model needs, from its GGUF header (modelfile.py, ~50 ms):

    weights   the file's size (mapped, read whole by the first decode)
    KV cache  slots x n_ctx tokens x layers x kv heads x (key + value
              length) x 2 bytes (llama.cpp's default f16 cache)
    compute   max(64 MiB, a tenth of the weights): llama.cpp's scratch
              buffers, logits, the sampler

A refusal is the caller's to turn into a declared error (residency.py
unloads idle models first and asks once more). When inferenced cannot be
reached at all (a node without it, dev mode before it starts) the model
runs unleased, said once in the log: the lease is accounting, never a
reason for a working node to stop answering.

Preemption: inferenced freezes a lease's cgroup. A worker gets a cgroup of
its own (cgroups.py) where runtimed's cgroup is delegated to it
(Delegate=yes); elsewhere its lease names no cgroup (inferenced never
freezes a leaser's own cgroup for its child), and is accounting only.
"""

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from syntrop.interfaces.clients import Inference1Client

logger = logging.getLogger(__name__)

#: Priorities of runtimed's lanes.
MAIN, TRIAGE = "Interactive", "EmergencyTriage"
#: The least compute reserve, and the share of the weights it grows with.
COMPUTE_MIN = 64 << 20
COMPUTE_SHARE = 0.1
#: Bytes per element of llama.cpp's default (f16) KV cache.
KV_BYTES = 2
#: Seconds inferenced has to answer.
TIMEOUT = 10.0
#: The group a worker's cgroup.freeze is given to (inferenced is a member).
FREEZER = "syntrop"


def _number(metadata: dict[str, Any], key: str, default: int = 0) -> int:
    value = metadata.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def need_bytes(size: int, metadata: dict[str, Any], *, n_ctx: int, slots: int) -> int:
    """The bytes a model of `size` bytes with GGUF `metadata` needs resident
    with `slots` contexts of `n_ctx` tokens (see the module's table)."""
    arch = metadata.get("general.architecture")
    prefix = f"{arch}." if isinstance(arch, str) else ""
    layers = _number(metadata, prefix + "block_count")
    embd = _number(metadata, prefix + "embedding_length")
    heads = _number(metadata, prefix + "attention.head_count", 1) or 1
    kv_heads = _number(metadata, prefix + "attention.head_count_kv", heads) or heads
    key = _number(metadata, prefix + "attention.key_length", embd // heads)
    value = _number(metadata, prefix + "attention.value_length", key)
    kv = slots * n_ctx * layers * kv_heads * (key + value) * KV_BYTES
    return size + kv + max(COMPUTE_MIN, int(size * COMPUTE_SHARE))


class Refused(Exception):
    """inferenced refused the lease: `reason` is its error's name (the last
    part), `params` its parameters."""

    def __init__(self, reason: str, params: dict[str, Any]) -> None:
        super().__init__(reason)
        self.reason, self.params = reason, params


@dataclass(frozen=True, slots=True)
class Held:
    lease_id: str
    plane: str
    memory: int


class Leases:
    """runtimed's leases, through Inference1 on `socket`."""

    def __init__(self, socket: "os.PathLike[str] | str") -> None:
        self.socket = os.fspath(socket)
        self._plane: str | None = None
        self._warned = False
        #: GetTopology's planes (ComputePlane: id, kind), once asked.
        self.planes: list[Any] = []

    async def _plane_id(self, inference: "Inference1Client") -> str:
        """The CPU plane: where runtimed's leases are taken today (placing.py
        places a lease on any plane; asking for GPU planes is still to come)."""
        if self._plane is None:
            topology = await inference.GetTopology()
            self.planes = list(topology["planes"])
            planes = [p for p in self.planes if p.kind == "cpu"]
            self._plane = planes[0].id if planes else "cpu"
        return self._plane

    async def acquire(self, pid: int, memory: int, priority: str) -> Held | None:
        """A lease of `memory` bytes for `pid`; None when inferenced cannot
        be reached (the model then runs unleased); Refused when it says no."""
        from asyncvarlink import VarlinkErrorReply

        from syntrop.interfaces.inference import Inference1
        from syntrop.varlink.client import CallTimeout, connect

        try:
            async with await connect(Inference1, address=self.socket,
                                     timeout=TIMEOUT) as inference:
                plane = await self._plane_id(inference)
                reply = await inference.AcquireLease(priority=priority, memory_bytes=memory,
                                                     plane=plane, unit=None, pid=pid)
        except VarlinkErrorReply as error:
            raise Refused(error.name.rpartition(".")[2], error.paramstojson() or {}) from None
        except (OSError, CallTimeout) as error:
            if not self._warned:
                logger.warning("inferenced unreachable (%s): models run unleased", error)
                self._warned = True
            return None
        self._warned = False
        return Held(reply["lease_id"], reply["plane_id"], reply["allocated_memory"])

    async def release(self, held: Held) -> None:
        """Give a lease back; one inferenced already dropped (its pid died)
        or that cannot be reached is no error."""
        from syntrop.interfaces.inference import Inference1
        from syntrop.varlink.client import connect

        try:
            async with await connect(Inference1, address=self.socket,
                                     timeout=TIMEOUT) as inference:
                await inference.ReleaseLease(lease_id=held.lease_id)
        except Exception as error:  # gone already, or inferenced is: nothing held
            logger.debug("lease %s not released: %s", held.lease_id, error)


class WorkerCgroups:
    """A cgroup of its own for each engine worker, below runtimed's, where
    systemd delegated runtimed's cgroup to it (Delegate=yes in
    runtimed.service, which says so with SYNTROP_DELEGATED=1): inferenced
    then freezes a preempted worker and nothing else. Elsewhere (dev mode,
    tests without systemd) workers share runtimed's cgroup and `place`
    gives None."""

    def __init__(self, environ: "dict[str, str] | os._Environ[str]" = os.environ) -> None:
        from syntrop.system import cgroup

        self.mount = self.base = None
        if environ.get("SYNTROP_DELEGATED") == "1":
            mount, own = cgroup.find_mount(), cgroup.cgroup_of_pid(os.getpid())
            if mount is not None and own is not None:
                self.mount, self.base = mount, own

    def place(self, pid: int) -> str | None:
        """Move worker `pid` into a cgroup of its own; its path, or None."""
        from syntrop.system import cgroup

        if self.mount is None or self.base is None:
            return None
        try:
            path = cgroup.make_child(self.mount, self.base, f"worker-{pid}")
            cgroup.move(self.mount, path, pid)
        except cgroup.CgroupError as error:
            logger.warning("engine worker %d stays in runtimed's cgroup: %s", pid, error)
            return None
        self._share_freezer(path)
        return path

    def _share_freezer(self, path: str) -> None:
        """Let group FREEZER into the worker's cgroup and write its
        cgroup.freeze: the files of a delegated subtree are runtimed's
        user's (its directories 0700 under UMask=0077), and inferenced, root
        without capabilities and a member of that group, must freeze it.
        Nobody else reaches the directory (0750)."""
        import grp

        assert self.mount is not None
        directory = self.mount / path.lstrip("/")
        try:
            gid = grp.getgrnam(FREEZER).gr_gid
            for target, mode in ((directory, 0o750), (directory / "cgroup.freeze", 0o660)):
                os.chown(target, -1, gid)
                os.chmod(target, mode)
        except (KeyError, OSError) as error:
            logger.warning("%s stays runtimed's alone (inferenced cannot freeze it): %s",
                           directory, error)

    def drop(self, path: str | None) -> None:
        """Remove a worker's cgroup once its process has ended."""
        from syntrop.system import cgroup

        if path is not None and self.mount is not None:
            cgroup.remove(self.mount, path)
