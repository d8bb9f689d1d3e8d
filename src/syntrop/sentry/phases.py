"""The pipeline's phases for real: the other daemons over Varlink, systemd
over D-Bus. Each call is bounded by the pipeline's budgets; the client's
own timeout is only a backstop.

Daemons never import each other: only the contracts in syntrop.interfaces.
"""

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from syntrop.sentry.pipeline import Executed, Facts, Phases
from syntrop.sentry.rules import DEFAULT_RECENT_USEC, Change, Decision
from syntrop.system.systemd import Systemd

CALL_TIMEOUT = 45.0
#: Bytes sentry leases for the model's decision (a small model's KV and
#: scratch; the weights are runtimed's).
LEASE_BYTES = 64 * 1024 * 1024


def _field(value: Any, name: str) -> Any:
    """A reply's field: replies are dicts, records are dataclasses."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def _unwrap(reply: Any, name: str) -> Any:
    return reply[name] if isinstance(reply, dict) and name in reply else reply


class Live:
    """The phases bound to this host. `systemd` is None without a bus."""

    def __init__(self, *, systemd: Systemd | None, model: str, hold_sec: float,
                 recent_usec: int = DEFAULT_RECENT_USEC, sysfs_root: Path = Path("/")) -> None:
        self.systemd = systemd
        self.model = model
        self.hold_sec = hold_sec
        self.recent_usec = recent_usec
        self.sysfs_root = sysfs_root
        #: The answer being decoded: text, tokens, when Chat was called.
        self._partial: tuple[str, int, float] | None = None

    def phases(self) -> Phases:
        return Phases(context=self.context, lease=self.lease, decide=self.decide,
                      execute=self.execute, verify=self.verify, release=self.release,
                      gang=self.gang, decide_progress=self.progress)

    def progress(self) -> str:
        """What the model had answered when its decision was cut off."""
        if self._partial is None:
            return "the model was not reached"
        from syntrop.sentry.decide import summarise

        text, tokens, since = self._partial
        return (f"the model had answered {summarise(text)!r} ({tokens} tokens) in "
                f"{(time.monotonic() - since) * 1e3:.0f} ms")

    async def context(self, unit: str, failure_usec: int) -> Facts:
        from syntrop.interfaces.context import Context1
        from syntrop.varlink.client import connect

        async with await connect(Context1, timeout=CALL_TIMEOUT) as context:
            reply = await context.GetUnitContext(unit=unit, failure_usec=failure_usec)
        changes = [
            Change(kind=str(_field(e, "kind")), timestamp_usec=int(_field(e, "timestamp_usec")),
                   path=_field(e, "path"), unit=_field(e, "unit"), action=_field(e, "action"),
                   package=_field(e, "package"), summary=str(_field(e, "summary") or ""))
            for e in _field(reply, "events") or []]
        journal = [str(_field(line, "message")) for line in _field(reply, "journal") or []]
        named = sorted({c.package for c in changes if c.kind == "package" and c.package})
        packages = f", packages: {', '.join(named)}" if named else ""
        return Facts(failure_usec=int(_field(reply, "failure_usec") or failure_usec),
                     changes=changes, journal=journal,
                     summary=f"{len(changes)} events ({_kinds(changes)}), "
                             f"{len(journal)} journal lines{packages}")

    async def gang(self, unit: str, facts: Facts) -> str:
        """Classify the context's kernel and journal lines; quarantine the
        faulty planes through Inference1; say which and why."""
        # The classifier and the prompt builder load on the first incident,
        # not on every socket-activated start.
        from syntrop.sentry import gang

        faults = gang.classify(facts.kernel_lines())
        if not faults:
            return gang.Verdict().summary()
        from syntrop.interfaces.inference import Inference1
        from syntrop.system import sysfs
        from syntrop.varlink.client import connect

        chains = {a.id: a.pci.chain if a.pci else ()
                  for a in await asyncio.to_thread(sysfs.accelerators, self.sysfs_root)}
        async with await connect(Inference1, timeout=CALL_TIMEOUT) as inference:
            topology = await inference.GetTopology()
            planes = [gang.Plane(id=str(_field(p, "id")),
                                 chain=chains.get(str(_field(p, "id")), ()))
                      for p in _field(topology, "planes") or []]
            verdict = gang.judge(faults, planes)
            for plane, why in sorted(verdict.quarantine.items()):
                await inference.Quarantine(plane=plane, reason=f"sentry: {why}"[:500])
        return verdict.summary()

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
        """Ask the model through Runtime1.Chat, offering only the tools the
        evidence allows. Fails (and the rules decide) when toold or runtimed
        is absent or the answer is not an acceptable call of an offered tool;
        the error carries the raw answer."""
        from syntrop.interfaces.tool import Tool1
        from syntrop.sentry import decide
        from syntrop.varlink.client import connect

        started = time.monotonic()
        self._partial = None
        async with await connect(Tool1, timeout=CALL_TIMEOUT) as tool:
            known = decide.specs(_unwrap(await tool.ListTools(), "tools"))
        listed = time.monotonic()
        evidence = decide.Evidence(unit=unit, failure_usec=facts.failure_usec,
                                   changes=facts.changes, journal=facts.journal)
        offered = decide.offers(evidence, known, self.recent_usec)
        text, tokens = await self.chat(decide.messages(evidence, offered),
                                       decide.answer_schema(offered, unit))
        answered = time.monotonic()
        timing = (f"{tokens} tokens; ListTools {(listed - started) * 1e3:.0f} ms, "
                  f"Chat {(answered - listed) * 1e3:.0f} ms")
        offer = "|".join(s.name for s in offered)
        try:
            chosen = decide.parse(text, offered, unit)
        except decide.AnswerError as error:
            raise decide.AnswerError(f"answer {decide.summarise(text)!r} rejected: {error} "
                                     f"(offered {offer}; {timing})") from None
        return Decision(tool=chosen.tool, parameters=chosen.parameters,
                        reason=f"answer {decide.summarise(text)!r} (offered {offer}; {timing})")

    async def chat(self, messages: list[tuple[str, str]],
                   schema: dict[str, Any]) -> tuple[str, int]:
        """The one Runtime1.Chat call: greedy, short, seeded, and constrained
        to `schema` (the accepted answers), so the answer always parses; it
        is still checked as strictly as before. Returns the text and the
        tokens generated."""
        import json

        from syntrop.interfaces.runtime import ChatMessage, Constraint, Runtime1, Sampling
        from syntrop.sentry import decide
        from syntrop.varlink.client import connect

        sampling = Sampling(max_tokens=decide.MAX_TOKENS, temperature=decide.TEMPERATURE,
                            top_p=None, top_k=None, seed=decide.SEED, stop=None)
        text, tokens = "", 0
        self._partial = (text, tokens, time.monotonic())
        async with await connect(Runtime1, timeout=CALL_TIMEOUT) as runtime:
            async for reply in runtime.Chat(
                    model=self.model, sampling=sampling,
                    constraint=Constraint(json_schema=json.dumps(schema)),
                    messages=[ChatMessage(role=role, content=content)
                              for role, content in messages]):
                chunk = _unwrap(reply, "chunk")
                text += str(_field(chunk, "text") or "")
                tokens += int(_field(chunk, "tokens") or 0)
                self._partial = (text, tokens, self._partial[2])
        return text, tokens

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


def _kinds(changes: list[Change]) -> str:
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.kind] = counts.get(change.kind, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none"


def describe(decision: Decision) -> str:
    return json.dumps({"tool": decision.tool, "parameters": decision.parameters})
