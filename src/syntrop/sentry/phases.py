"""The pipeline's phases for real: the other daemons over Varlink, systemd
over D-Bus. Each call is bounded by the pipeline's budgets; the client's
own timeout is only a backstop.

Daemons never import each other: only the contracts in syntrop.interfaces.
"""

import asyncio
import json
import os
from typing import Any

from syntrop.sentry.pipeline import Executed, Facts, Phases, parse_decision
from syntrop.sentry.rules import Change, Decision
from syntrop.system.systemd import Systemd

CALL_TIMEOUT = 45.0
#: Bytes sentry leases for the model's decision (a small model's KV and
#: scratch; the weights are runtimed's).
LEASE_BYTES = 64 * 1024 * 1024
SYSTEM_PROMPT = (
    "You are systemd-sentry. A systemd unit failed. Choose exactly one remediation "
    'tool and answer only with JSON: {"tool": NAME, "parameters": {...}}.')


def _field(value: Any, name: str) -> Any:
    """A reply's field: replies are dicts, records are dataclasses."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def _unwrap(reply: Any, name: str) -> Any:
    return reply[name] if isinstance(reply, dict) and name in reply else reply


class Live:
    """The phases bound to this host. `systemd` is None without a bus."""

    def __init__(self, *, systemd: Systemd | None, model: str, hold_sec: float) -> None:
        self.systemd = systemd
        self.model = model
        self.hold_sec = hold_sec

    def phases(self) -> Phases:
        return Phases(context=self.context, lease=self.lease, decide=self.decide,
                      execute=self.execute, verify=self.verify, release=self.release)

    async def context(self, unit: str, failure_usec: int) -> Facts:
        from syntrop.interfaces.context import Context1
        from syntrop.varlink.client import connect

        async with await connect(Context1, timeout=CALL_TIMEOUT) as context:
            reply = await context.GetUnitContext(unit=unit, failure_usec=failure_usec)
        changes = [
            Change(kind=str(_field(e, "kind")), timestamp_usec=int(_field(e, "timestamp_usec")),
                   path=_field(e, "path"), unit=_field(e, "unit"))
            for e in _field(reply, "events") or []]
        return Facts(failure_usec=int(_field(reply, "failure_usec") or failure_usec),
                     changes=changes,
                     summary=f"{len(changes)} events, "
                             f"{len(_field(reply, 'journal') or [])} journal lines")

    async def lease(self, unit: str) -> str:
        from syntrop.interfaces.inference import Inference1
        from syntrop.varlink.client import connect

        async with await connect(Inference1, timeout=CALL_TIMEOUT) as inference:
            reply = await inference.AcquireLease(
                priority="EmergencyTriage", memory_bytes=LEASE_BYTES, plane=None,
                unit=None, pid=os.getpid())
        return str(_field(reply, "lease_id"))

    async def release(self, lease_id: str) -> None:
        from syntrop.interfaces.inference import Inference1
        from syntrop.varlink.client import connect

        async with await connect(Inference1, timeout=CALL_TIMEOUT) as inference:
            await inference.ReleaseLease(lease_id=lease_id)

    async def decide(self, unit: str, facts: Facts) -> Decision:
        """Ask the model through Runtime1.Chat. Fails (and the rules decide)
        when runtimed is absent, does not implement Chat, or answers
        something that is not a tool call of a listed tool."""
        from syntrop.interfaces.runtime import ChatMessage, Runtime1
        from syntrop.interfaces.tool import Tool1
        from syntrop.varlink.client import connect

        async with await connect(Tool1, timeout=CALL_TIMEOUT) as tool:
            tools = _unwrap(await tool.ListTools(), "tools")
        names = {str(_field(t, "name")) for t in tools}
        catalogue = "\n".join(f"- {_field(t, 'name')}: {_field(t, 'description')}"
                              for t in tools)
        changes = "\n".join(f"- {c.kind} {c.path or ''} at {c.timestamp_usec}"
                            for c in facts.changes[:20]) or "- none"
        prompt = (f"Unit: {unit}\nFailed at: {facts.failure_usec}\n"
                  f"Recent changes:\n{changes}\nTools:\n{catalogue}\n")
        text = ""
        async with await connect(Runtime1, timeout=CALL_TIMEOUT) as runtime:
            async for reply in runtime.Chat(model=self.model, messages=[
                    ChatMessage(role="system", content=SYSTEM_PROMPT),
                    ChatMessage(role="user", content=prompt)]):
                text += str(_field(_unwrap(reply, "chunk"), "text"))
        decision = parse_decision(text)
        if decision.tool not in names:
            raise ValueError(f"the model chose an unknown tool {decision.tool!r}")
        return Decision(tool=decision.tool,
                        parameters={**decision.parameters, "unit": unit}, reason="model")

    async def execute(self, decision: Decision) -> Executed:
        from syntrop.interfaces.tool import Tool1
        from syntrop.varlink.client import connect

        async with await connect(Tool1, timeout=CALL_TIMEOUT) as tool:
            reply = await tool.Execute(tool=decision.tool, parameters=decision.parameters)
        outcome = str(_field(reply, "outcome"))
        if outcome != "succeeded":
            raise RuntimeError(f"{decision.tool} {outcome}: {_field(reply, 'message')}")
        return Executed(outcome=outcome, message=str(_field(reply, "message") or ""))

    async def still_failed(self, unit: str) -> bool:
        if self.systemd is None:
            return False
        return (await self.systemd.unit_state(unit)).active_state == "failed"

    async def verify(self, unit: str) -> bool:
        """Active now and still active after the hold."""
        if self.systemd is None:
            raise RuntimeError("no system bus: cannot see the unit's state")
        state = await self.systemd.unit_state(unit)
        if state.active_state != "active":
            return False
        await asyncio.sleep(self.hold_sec)
        state = await self.systemd.unit_state(unit)
        return state.active_state == "active"


def describe(decision: Decision) -> str:
    return json.dumps({"tool": decision.tool, "parameters": decision.parameters})
