"""unit_restart: Manager.RestartUnit, then the job's result (JobRemoved) and
the unit's ActiveState."""

from typing import Any

from syntrop.system.systemd import SystemdError
from syntrop.toold import dropins, errors
from syntrop.toold.context import Context
from syntrop.toold.tools.base import UNIT, Outcome, Param, Plan, Tool


class UnitRestart(Tool):
    name = "unit_restart"
    description = ("Restart one allowed unit and report the job's result and the unit's "
                   "state afterwards.")
    risk = "remediation"
    reversible = False
    rollback = "none: a restart cannot be undone; rate limits keep it from looping"
    sandboxed = False
    parameters = (
        UNIT,
        Param(name="timeout_sec", type=int, minimum=1, maximum=600,
              description="How long to wait for the job (default from toold.toml)."),
    )

    async def prepare(self, args: dict[str, Any], ctx: Context) -> Plan:
        unit = str(args["unit"])
        state = await ctx.unit_state(unit)
        timeout = float(args.get("timeout_sec") or ctx.config.job_timeout)
        return Plan(
            unit=unit,
            steps=[f"call Manager.RestartUnit({unit!r}, 'replace') on PID 1 "
                   f"(it is {state.active_state}/{state.sub_state} now)",
                   f"wait up to {timeout:g} s for the job's JobRemoved",
                   f"read {unit}'s ActiveState"],
            data={"timeout": timeout, "before": state.active_state},
        )

    async def execute(self, plan: Plan, ctx: Context) -> Outcome:
        unit = str(plan.unit)
        try:
            systemd = await ctx.systemd()
            job = await systemd.run_job("RestartUnit", unit, timeout=plan.data["timeout"])
            after = await systemd.unit_state(unit)
        except SystemdError as error:
            ctx.drop_systemd()
            return Outcome(outcome="failed", message=f"RestartUnit failed: {error}",
                           previous_active_state=plan.data["before"])
        except errors.ToolError as error:
            return Outcome(outcome="failed", message=str(error))
        ok = job.result == "done" and dropins.health(after.active_state, after.result) >= 2
        return Outcome(
            outcome="succeeded" if ok else "failed",
            message=f"restart job {job.result}; {unit} is {after.active_state}/{after.sub_state}",
            job_result=job.result, active_state=after.active_state,
            previous_active_state=plan.data["before"],
            details={"job": job.job, "sub_state": after.sub_state, "result": after.result,
                     "n_restarts": after.n_restarts},
        )
