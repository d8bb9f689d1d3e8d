"""The tools, one module each, keyed by their class-level `name`."""

from syntrop.toold.tools.base import Outcome, Param, Plan, Tool
from syntrop.toold.tools.clear_cache import ClearCache
from syntrop.toold.tools.daemon_reload import DaemonReload
from syntrop.toold.tools.downgrade_package import DowngradePackage
from syntrop.toold.tools.free_space import FreeSpace
from syntrop.toold.tools.revert_config import RevertConfig
from syntrop.toold.tools.revert_dropin import RevertDropin
from syntrop.toold.tools.unit_restart import UnitRestart

TOOL_TYPES: dict[str, type[Tool]] = {
    tool.name: tool for tool in (DaemonReload, UnitRestart, RevertDropin, ClearCache, RevertConfig,
                                 FreeSpace, DowngradePackage)
}

__all__ = ["TOOL_TYPES", "Outcome", "Param", "Plan", "Tool"]
