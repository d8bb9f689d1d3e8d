"""daemon_reload: Manager.Reload over D-Bus to PID 1, nothing else."""

from typing import Any

from syntrop.system.systemd import SystemdError
from syntrop.toold.context import Context
from syntrop.toold.tools.base import Outcome, Plan, Tool


class DaemonReload(Tool):
    name = "daemon_reload"
    description = "Make systemd re-read unit files (systemctl daemon-reload)."
    risk = "safe"
    reversible = False
    rollback = "none needed: reloading changes no file"
    sandboxed = False

    async def prepare(self, args: dict[str, Any], ctx: Context) -> Plan:
        await ctx.systemd()
        return Plan(steps=["call org.freedesktop.systemd1.Manager.Reload on PID 1"])

    async def execute(self, plan: Plan, ctx: Context) -> Outcome:
        try:
            await (await ctx.systemd()).reload()
        except SystemdError as error:
            ctx.drop_systemd()
            return Outcome(outcome="failed", message=f"Reload failed: {error}")
        return Outcome(outcome="succeeded", message="systemd reloaded its unit files")
