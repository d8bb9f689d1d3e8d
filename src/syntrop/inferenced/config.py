"""inferenced.toml, validated into records.

    root = "/"                      # where /sys and /proc are read (tests: a fake tree)

    [triage]
    plane = "cpu"                   # a plane kept for EmergencyTriage
    reserve_bytes = 1073741824      # how much of it (0: all of it)

    [pressure]                      # avg10 "some" percentages
    memory_elevated = 10.0
    memory_critical = 25.0
    # cpu_elevated / cpu_critical / io_elevated / io_critical: unset by
    # default, so only memory pressure refuses leases (a busy CPU is no
    # reason to refuse memory); set them to let CPU or I/O stalls count.

    [devices.drm-renderD128]        # for devices whose memory sysfs does not tell
    name = "Accelerator A"
    memory_bytes = 25769803776

    [devices.cpu]                   # the CPU plane: host RAM leases may hold
    memory_bytes = 8589934592       # (default: all of MemTotal)

    emergency_units = ["runtimed.service"]   # (top level) may lease EmergencyTriage
                                              # without polkit: runtimed's triage lane
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syntrop.config import ConfigError, integer, load_toml, number, section
from syntrop.inferenced.topology import DeviceConfig, TopologyConfig

DEFAULT_THRESHOLDS = {"memory": (10.0, 25.0)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    root: Path = Path("/")
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    #: Units whose processes may take EmergencyTriage leases without polkit:
    #: runtimed's triage lane (its dynamic user cannot reach the system bus,
    #: so polkit cannot be asked for it). Told apart by the kernel's cgroup.
    emergency_units: tuple[str, ...] = ("runtimed.service",)
    #: resource -> (elevated, critical) avg10 thresholds in percent.
    thresholds: dict[str, tuple[float, float]] = field(
        default_factory=lambda: dict(DEFAULT_THRESHOLDS)
    )


def parse(data: dict[str, Any], where: str = "inferenced.toml") -> Config:
    root = Path(str(data.get("root", "/")))
    triage = section(data, "triage", where)
    devices: dict[str, DeviceConfig] = {}
    for device_id, table in section(data, "devices", where).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [devices.{device_id}] must be a table")
        memory = table.get("memory_bytes")
        if memory is not None:
            memory = integer(table, "memory_bytes", 0, f"{where}: [devices.{device_id}]")
        devices[device_id] = DeviceConfig(name=table.get("name"), memory_bytes=memory)
    reserve = integer(triage, "reserve_bytes", 0, f"{where}: [triage]")
    pressure = section(data, "pressure", where)
    thresholds = dict(DEFAULT_THRESHOLDS)
    for resource in ("memory", "cpu", "io"):
        keys = (f"{resource}_elevated", f"{resource}_critical")
        if resource in thresholds or any(key in pressure for key in keys):
            elevated, critical = thresholds.get(resource, (float("inf"), float("inf")))
            thresholds[resource] = (
                number(pressure, keys[0], elevated, f"{where}: [pressure]"),
                number(pressure, keys[1], critical, f"{where}: [pressure]"),
            )
    units = data.get("emergency_units", ["runtimed.service"])
    if not isinstance(units, list) or not all(isinstance(u, str) for u in units):
        raise ConfigError(f"{where}: emergency_units must be a list of unit names")
    return Config(
        root=root,
        emergency_units=tuple(units),
        topology=TopologyConfig(
            devices=devices, triage_plane=triage.get("plane"), triage_reserve_bytes=reserve
        ),
        thresholds=thresholds,
    )


def load(path: Path) -> Config:
    return parse(load_toml(path), str(path))
