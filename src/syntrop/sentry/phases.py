"""The pipeline's phases for real: the other daemons over Varlink, systemd
over D-Bus. Each call is bounded by the pipeline's budgets; the client's
own timeout is only a backstop.

Daemons never import each other: only the contracts in syntrop.interfaces.
"""

import asyncio
import dataclasses
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syntrop.packaged import QWEN_CODER_05B, SMOLLM2
from syntrop.sentry.findings import Change, Plan, UnitFacts
from syntrop.sentry.pipeline import KNOWN_TOOLS, Executed, Facts, Phases, StepRecord
from syntrop.sentry.warm import NoTriageModel, WarmSession
from syntrop.system.systemd import Systemd

if TYPE_CHECKING:
    from syntrop.interfaces.runtime import Sampling

logger = logging.getLogger(__name__)

CALL_TIMEOUT = 45.0
#: The triage models, best first, when sentry.toml names none: the most
#: right answers within decide's budget on the labelled set
#: (docs/BENCHMARKS.md). Chosen from what modeld holds at each incident.
TRIAGE_MODELS = (QWEN_CODER_05B.name, "qwen2.5-coder-1.5b")
#: Models known to be unfit for triage: never chosen unless configured
#: (SmolLM2-135M answers "nothing" to every failure under this prompt).
UNFIT = (SMOLLM2.name,)


#: An absolute path in a journal line (quotes and punctuation around it cut).
PATH = re.compile(r"(?<![\w.~:/-])(/(?:[\w.@+-]+/)*[\w.@+-]+)")
#: A filesystem with less than this share of its blocks free (or none at
#: all for the unit's user) counts as full.
FULL_SHARE = 0.01


def named_paths(journal: list[str]) -> list[str]:
    """The absolute paths the journal lines name, in order, once each."""
    return list(dict.fromkeys(match for line in journal for match in PATH.findall(line)))


def full_filesystems(paths: list[str]) -> tuple[str, ...]:
    """Those of `paths` whose filesystem is full (statvfs of the path, or
    of its nearest existing parent), at most one path per filesystem."""
    full: dict[int, str] = {}
    for path in paths[:16]:
        probe = path
        while probe != "/" and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        try:
            st = os.statvfs(probe)
            device = os.stat(probe).st_dev
        except OSError:
            continue
        if st.f_blocks and (st.f_bavail == 0 or st.f_bavail / st.f_blocks < FULL_SHARE):
            full.setdefault(device, path)
    return tuple(full.values())


#: dpkg's file lists: PACKAGE.list (or PACKAGE:ARCH.list), a path a line.
DPKG_INFO = "/var/lib/dpkg/info"


def _spellings(program: str) -> set[str]:
    """The paths a package's file list may give `program` as: itself, its
    target, and its other half across a merged /usr (/bin and /usr/bin)."""
    names = {program, os.path.realpath(program)}
    for name in list(names):
        if name.startswith(("/bin/", "/sbin/", "/lib/")):
            names.add("/usr" + name)
        elif name.startswith(("/usr/bin/", "/usr/sbin/", "/usr/lib/")):
            names.add(name[len("/usr"):])
    return names


def program_packages(programs: tuple[str, ...], packages: list[str],
                     info: str = DPKG_INFO) -> tuple[tuple[str, str], ...]:
    """(package, program) for each of `packages` whose dpkg file list holds
    one of `programs` (read offline; a package without a list owns
    nothing)."""
    wanted = {spelling: program for program in programs for spelling in _spellings(program)}
    owners: list[tuple[str, str]] = []
    if not wanted:
        return ()
    try:
        listed = [name for name in os.listdir(info) if name.endswith(".list")]
    except OSError:
        return ()
    for package in packages[:32]:
        for name in (n for n in listed
                     if n == f"{package}.list" or n.startswith(f"{package}:")):
            try:
                with open(os.path.join(info, name), encoding="utf-8", errors="replace") as file:
                    held = next((wanted[line.rstrip("\n")] for line in file
                                 if line.rstrip("\n") in wanted), None)
            except OSError:
                continue
            if held is not None:
                owners.append((package, held))
                break
    return tuple(owners)


def choose_model(configured: str | None, held: "list[str] | tuple[str, ...]") -> str | None:
    """The model to ask now: the configured one, else the best triage model
    modeld holds (`held`: its names), else None (the rules decide). A model
    known to be unfit (UNFIT) is never chosen unless configured."""
    if configured:
        return configured
    have = {name.removesuffix(":latest") for name in held}
    return next((name for name in TRIAGE_MODELS if name in have and name not in UNFIT), None)
#: How often verify looks at the unit during its hold.
VERIFY_POLL = 0.25
SECOND = 1_000_000
#: Bytes sentry leases for the model's decision (a small model's KV and
#: scratch; the weights are runtimed's).
LEASE_BYTES = 64 * 1024 * 1024


class Live:
    """The phases bound to this host. `systemd` is None without a bus."""

    def __init__(self, *, systemd: Systemd | None, model: str | None,
                 window_usec: int | None = None, sysfs_root: Path = Path("/"),
                 warm: bool = True) -> None:
        self.systemd = systemd
        #: The configured triage model; None: chosen at each incident from
        #: what modeld holds (choose_model).
        self.model = model
        #: The model the last look chose ("" before any; None: none).
        self.chosen: str | None = ""
        self.window_usec = window_usec
        self.sysfs_root = sysfs_root
        #: The answer being decoded: text, tokens, when the model was asked.
        self._partial: tuple[str, int, float] | None = None
        #: The warm triage session (warm.py); None: a Runtime1.Chat per
        #: incident, the whole prompt each time.
        self.warm: WarmSession | None = None
        if warm:
            from syntrop.sentry import decide

            self.warm = WarmSession(self._model, decide.prefix_messages)

    def phases(self) -> Phases:
        return Phases(context=self.context, lease=self.lease, decide=self.decide,
                      execute=self.execute, verify=self.verify, release=self.release,
                      gang=self.gang, decide_progress=self.progress,
                      decide_ready=self.ready if self.warm is not None else None,
                      decide_tokens=self.tokens)

    def tokens(self) -> int:
        """Tokens the model has answered so far in this decide."""
        return 0 if self._partial is None else self._partial[1]

    async def ready(self) -> str:
        """The warm session with its prefix resident (EnsurePrefix again:
        every token reused, a spilled session brought back), reopened once
        if it is gone; what it holds, in words."""
        assert self.warm is not None
        try:
            model, _ = await self._model()  # what modeld holds now decides
            await self.warm.follow(model)
            opened, reused, prefilled = await self.warm.ensure()
        except NoTriageModel as error:
            raise RuntimeError(str(error)) from None
        except Exception as error:
            raise RuntimeError(f"no triage session: {type(error).__name__}: {error}") from None
        return (f"session of {opened.model}: {reused} prefix tokens reused, "
                f"{prefilled} prefilled")

    def progress(self) -> str:
        """What the model had answered when its decision was cut off."""
        if self._partial is None:
            return "the model was not reached"
        from syntrop.sentry.decide import summarise

        text, tokens, since = self._partial
        return (f"the model had answered {summarise(text)!r} ({tokens} tokens) in "
                f"{(time.monotonic() - since) * 1e3:.0f} ms")

    async def context(self, unit: str, failure_usec: int) -> Facts:
        """contextd's timeline and journal slice, systemd's view of the unit
        and toold's tools, asked at once."""
        timeline, facts, tools = await asyncio.gather(
            self._timeline(unit, failure_usec), self.unit_facts(unit), self._tools(),
            return_exceptions=True)
        unread: tuple[str, ...] = ()
        changes: list[Change]
        journal: list[str]
        if isinstance(timeline, BaseException):
            # systemd's view still counts (a stale definition, a missing
            # program need no timeline); the cause says what is missing.
            if not isinstance(facts, UnitFacts):
                raise timeline
            changes, journal, at = [], [], failure_usec
            unread = (f"contextd's timeline: {type(timeline).__name__}: {timeline}"[:200],)
        else:
            changes, journal, at = timeline
        named = sorted({c.package for c in changes if c.kind == "package" and c.package})
        packages = f", packages: {', '.join(named)}" if named else ""
        seen = "" if isinstance(facts, UnitFacts) else f"; systemd not asked: {facts}"
        seen += "".join(f"; not read: {u}" for u in unread)
        unit_facts = facts if isinstance(facts, UnitFacts) else None
        if unit_facts is not None:
            full = await asyncio.to_thread(full_filesystems, named_paths(journal))
            upgraded = sorted({c.package for c in changes
                               if c.kind == "package" and c.package and not c.path
                               and c.action == "upgrade"})
            owners = await asyncio.to_thread(program_packages, unit_facts.exec_paths,
                                             upgraded) if upgraded else ()
            unit_facts = dataclasses.replace(unit_facts, full_paths=full,
                                             program_packages=owners)
        return Facts(failure_usec=at, changes=changes, journal=journal, unread=unread,
                     unit=unit_facts,
                     tools=tuple(tools) if isinstance(tools, list) else KNOWN_TOOLS,
                     summary=f"{len(changes)} events ({_kinds(changes)}), "
                             f"{len(journal)} journal lines{packages}{seen}")

    async def _timeline(self, unit: str, failure_usec: int
                        ) -> tuple[list[Change], list[str], int]:
        from syntrop.interfaces.context import Context1
        from syntrop.varlink.client import connect

        async with await connect(Context1, timeout=CALL_TIMEOUT) as context:
            reply = await context.GetUnitContext(unit=unit, failure_usec=failure_usec,
                                                 window_usec=self.window_usec)
        changes = [
            Change(kind=e.kind, timestamp_usec=e.timestamp_usec, path=e.path, unit=e.unit,
                   action=e.action, package=e.package, summary=e.summary)
            for e in reply["events"]]
        journal = [line.message for line in reply["journal"]]
        return changes, journal, reply["failure_usec"] or failure_usec

    async def _tools(self) -> list[str]:
        from syntrop.interfaces.tool import Tool1
        from syntrop.varlink.client import connect

        async with await connect(Tool1, timeout=CALL_TIMEOUT) as tool:
            return [info.name for info in (await tool.ListTools())["tools"]]

    async def unit_facts(self, unit: str) -> UnitFacts:
        """What systemd says of the unit (findings.UnitFacts)."""
        if self.systemd is None:
            raise RuntimeError("no system bus")
        systemd = self.systemd
        props = await systemd.unit_properties(unit)
        requires = tuple(dict.fromkeys(
            str(name) for key in ("Requires", "BindsTo", "Requisite")
            for name in props.get(key, ()) or ()))

        async def state(dependency: str) -> tuple[bool, int]:
            """Whether it is failed, and when it last went down."""
            try:
                dep = await systemd.unit_properties(dependency)
            except Exception:  # an unloadable dependency is not a failed one
                return False, 0
            return (str(dep.get("ActiveState", "")) == "failed",
                    int(dep.get("InactiveEnterTimestamp", 0) or 0))

        states = await asyncio.gather(*(state(d) for d in requires))
        programs = tuple(str(entry[0]) for entry in props.get("ExecStart", ()) or ()
                         if entry and entry[0])

        missing = tuple(p for p in programs if not os.path.exists(p))
        fragment = str(props.get("FragmentPath", ""))
        drop_ins = tuple(str(p) for p in props.get("DropInPaths", ()) or ())

        def directories(key: str, root: str) -> tuple[str, ...]:
            return tuple(f"{root}/{name}" for name in props.get(key, ()) or ())

        return UnitFacts(
            unit=unit, load_state=str(props.get("LoadState", "")),
            active_state=str(props.get("ActiveState", "")), result=str(props.get("Result", "")),
            exec_main_code=int(props.get("ExecMainCode", 0) or 0),
            exec_main_status=int(props.get("ExecMainStatus", 0) or 0),
            need_daemon_reload=bool(props.get("NeedDaemonReload", False)),
            active_enter_usec=int(props.get("ActiveEnterTimestamp", 0) or 0),
            inactive_exit_usec=int(props.get("InactiveExitTimestamp", 0) or 0),
            fragment_path=fragment, drop_in_paths=drop_ins, exec_paths=programs,
            missing_exec=missing,
            missing_named_by=await asyncio.to_thread(
                named_by, (fragment, *drop_ins) if fragment else drop_ins, missing),
            cache_dirs=directories("CacheDirectory", "/var/cache"),
            state_dirs=directories("StateDirectory", "/var/lib"),
            runtime_dirs=directories("RuntimeDirectory", "/run"),
            requires=requires,
            failed_dependencies=tuple(d for d, (bad, _) in zip(requires, states, strict=True)
                                      if bad),
            dependencies_down=tuple((d, at) for d, (bad, at) in
                                    zip(requires, states, strict=True) if not bad),
            n_restarts=int(props.get("NRestarts", 0) or 0))

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
            planes = [gang.Plane(id=p.id, chain=chains.get(p.id, ()))
                      for p in topology["planes"]]
            verdict = gang.judge(faults, planes)
            for plane, why in sorted(verdict.quarantine.items()):
                await inference.Quarantine(plane=plane, reason=f"sentry: {why}"[:500])
        return verdict.summary()

    async def lease(self, unit: str) -> str:
        from syntrop.interfaces.inference import Inference1
        from syntrop.varlink.client import connect

        async with await connect(Inference1, timeout=CALL_TIMEOUT) as inference:
            # The plane runtimed computes on (the CPU's), and its compute:
            # exclusive freezes the Batch and Interactive workers there
            # while the triage model answers in its own lane.
            topology = await inference.GetTopology()
            cpu = next((p.id for p in topology["planes"] if p.kind == "cpu"), None)
            # The warm session lives in the triage lane's worker too.
            reply = await inference.AcquireLease(
                priority="EmergencyTriage", memory_bytes=LEASE_BYTES, plane=cpu,
                unit=None, pid=os.getpid(), exclusive=True)
        return reply["lease_id"]

    async def release(self, lease_id: str) -> None:
        from syntrop.interfaces.inference import Inference1
        from syntrop.varlink.client import connect

        async with await connect(Inference1, timeout=CALL_TIMEOUT) as inference:
            await inference.ReleaseLease(lease_id=lease_id)

    async def decide(self, unit: str, findings: list[str], cause: str, journal: list[str],
                     offered: list[Plan]) -> Plan:
        """Ask the model to choose among the offered plans (its answer
        constrained to them): in the warm session, only this incident's turn
        is prefilled; without one, Runtime1.Chat with the whole prompt.
        Fails (and the rules' plan stands) when runtimed is absent or the
        answer is not an offered plan; the error carries the raw answer."""
        from syntrop.sentry import decide

        started = time.monotonic()
        self._partial = None
        evidence = decide.Evidence(unit=unit, findings=findings, cause=cause, journal=journal)
        if self.warm is not None:
            rest, tokens, how = await self.session_answer(
                decide.suffix_messages(evidence, offered), decide.answer_regex(offered))
            text = decide.OPENING + rest.strip().removesuffix('"') + '"'  # as written
        else:
            text, tokens = await self.chat(decide.messages(evidence, offered),
                                           decide.answer_schema(offered))
            how = "Chat"
        timing = f"{tokens} tokens; {how} {(time.monotonic() - started) * 1e3:.0f} ms"
        offer = " | ".join(p.describe() for p in offered)
        try:
            chosen = decide.parse_rest(rest, offered) if self.warm is not None \
                else decide.parse(text, offered)
        except decide.AnswerError as error:
            raise decide.AnswerError(f"answer {decide.summarise(text)!r} rejected: {error} "
                                     f"(offered {offer}; {timing})") from None
        return Plan(steps=chosen.steps, reason=f"answer {decide.summarise(text)!r} (offered "
                                               f"{offer}; {timing})")

    @staticmethod
    def _sampling(stop: list[str] | None = None) -> "Sampling":
        from syntrop.interfaces.runtime import Sampling
        from syntrop.sentry import decide

        return Sampling(max_tokens=decide.MAX_TOKENS, temperature=decide.TEMPERATURE,
                        top_p=None, top_k=None, seed=decide.SEED, stop=stop)

    async def session_answer(self, suffix: list[tuple[str, str]], regex: str
                             ) -> tuple[str, int, str]:
        """This incident's turn prefilled after the warm session's prefix,
        the answer's opening quote with it (decide.OPENING), and the rest
        decoded (greedy, short, seeded, constrained to `regex`, stopped by
        the closing quote before it is evaluated). Returns the text after
        the opening quote, the tokens and how, in words."""
        from syntrop.interfaces.runtime import Constraint
        from syntrop.sentry.warm import chatml

        assert self.warm is not None
        since = time.monotonic()
        self._partial = ("", 0, since)

        def seen(text: str, tokens: int) -> None:
            self._partial = (text, tokens, since)

        from syntrop.sentry.decide import OPENING

        answer = await self.warm.answer(chatml(suffix, answer=True) + OPENING,
                                        self._sampling(stop=['"']), Constraint(regex=regex),
                                        seen)
        again = ", reopened" if answer.reopened else ""
        return answer.text, answer.tokens, (
            f"session{again} ({answer.prefix_tokens} prefix tokens kept, "
            f"{answer.suffix_tokens} prefilled in {answer.prefill_s * 1e3:.0f} ms, decoded in "
            f"{answer.decode_s * 1e3:.0f} ms)")

    async def chat(self, messages: list[tuple[str, str]],
                   schema: dict[str, Any]) -> tuple[str, int]:
        """The one Runtime1.Chat call: greedy, short, seeded, and constrained
        to `schema` (the accepted answers), so the answer always parses; it
        is still checked as strictly as before. Returns the text and the
        tokens generated."""

        from syntrop.interfaces.runtime import ChatMessage, Constraint, Runtime1
        from syntrop.varlink.client import connect

        sampling = self._sampling()
        text, tokens = "", 0
        self._partial = (text, tokens, time.monotonic())
        model = await self.triage_model()
        async with await connect(Runtime1, timeout=CALL_TIMEOUT) as runtime:
            async for reply in runtime.Chat(
                    model=model, sampling=sampling, priority="EmergencyTriage",
                    constraint=Constraint(json_schema=json.dumps(schema)),
                    messages=[ChatMessage(role=role, content=content)
                              for role, content in messages]):
                text += reply["chunk"].text
                tokens += reply["chunk"].tokens
                self._partial = (text, tokens, self._partial[2])
        return text, tokens

    async def triage_model(self) -> str:
        """The model to ask now (choose_model over modeld's List)."""
        return (await self._model())[0]

    async def _model(self) -> tuple[str, str]:
        """The triage model (choose_model over what modeld holds now) and
        its weights' digest as modeld lists it ("" when not known). Raises
        NoTriageModel when there is none."""
        from syntrop.interfaces.model import Model, Model1
        from syntrop.varlink.client import connect

        try:
            async with await connect(Model1, timeout=CALL_TIMEOUT) as modeld:
                models = (await modeld.List())["models"]
        except Exception as error:  # modeld unreachable: only a configured model
            if self.model is None:
                self.chosen = None
                raise NoTriageModel(f"no triage model: modeld not reached ({error})") from None
            self.chosen = self.model
            return self.model, ""

        def name(m: Model) -> str:
            return m.name + ("" if m.tag == "latest" else f":{m.tag}")

        digests = {name(m): m.digest for m in models}
        chosen = choose_model(self.model, list(digests))
        if chosen != self.chosen:
            logger.info("triage model: %s", chosen or "none (the rules decide)")
        self.chosen = chosen
        if chosen is None:
            raise NoTriageModel("no triage model in modeld (qwen2.5-coder-0.5b or -1.5b; "
                                "sentry.toml's model names another): the rules decide")
        return chosen, digests.get(chosen, digests.get(chosen.removesuffix(":latest"), ""))

    async def changed(self, unit: str, since_usec: int) -> bool:
        """Whether `unit` was started, or contextd recorded a change that
        applies to it, after `since_usec`: what reopens an episode."""
        if self.systemd is not None:
            props = await self.systemd.unit_properties(unit)
            if int(props.get("InactiveExitTimestamp", 0) or 0) > since_usec:
                return True
        changes, _, _ = await self._timeline(unit, time.time_ns() // 1_000)
        return any(c.timestamp_usec > since_usec and c.kind != "kernel" for c in changes)

    async def execute(self, unit: str, plan: Plan) -> Executed:
        """The plan as one Tool1.ExecutePlan: toold checks it whole, runs
        each step as Execute does (audited), and stops at the first that
        does not succeed."""
        from asyncvarlink import VarlinkErrorReply

        from syntrop.interfaces.tool import PlanStep, Tool1
        from syntrop.varlink.client import connect

        try:
            async with await connect(Tool1, timeout=CALL_TIMEOUT) as tool:
                reply = await tool.ExecutePlan(unit=unit, steps=[
                    PlanStep(tool=step.tool, parameters=dict(step.parameters))
                    for step in plan.steps])
        except VarlinkErrorReply as error:
            return refused(plan, error.name, error.paramstojson() or {})
        steps = [StepRecord(tool=step.tool, parameters=dict(step.parameters),
                            outcome=result.outcome, message=result.error or result.message)
                 for step, result in zip(plan.steps, reply["steps"], strict=False)]
        return Executed(outcome=reply["outcome"], message=reply["message"], steps=steps)

    async def still_failed(self, unit: str) -> bool:
        if self.systemd is None:
            return False
        return (await self.systemd.unit_state(unit)).active_state == "failed"

    async def start_dependent(self, unit: str) -> bool:
        """Whether `unit` is still waiting for a start its dependency's
        failure cost it (inactive or failed, not started since)."""
        if self.systemd is None:
            return False
        state = await self.systemd.unit_state(unit)
        return state.active_state in ("inactive", "failed")

    async def verify(self, unit: str, hold_usec: int) -> bool:
        """Active now, and at every look through the hold, without systemd
        restarting it meanwhile (a unit that flaps is not healed)."""
        if self.systemd is None:
            raise RuntimeError("no system bus: cannot see the unit's state")
        first = await self.systemd.unit_state(unit)
        if first.active_state != "active":
            return False
        deadline = time.monotonic() + hold_usec / SECOND
        while True:
            await asyncio.sleep(min(VERIFY_POLL, max(0.0, deadline - time.monotonic())))
            state = await self.systemd.unit_state(unit)
            if state.active_state != "active" or state.n_restarts != first.n_restarts:
                return False
            if time.monotonic() >= deadline:
                return True


def named_by(files: tuple[str, ...], missing: tuple[str, ...]
             ) -> tuple[tuple[str, str], ...]:
    """(file, program) for each unit file or drop-in whose ExecStart= names
    one of the `missing` programs (an unreadable file names none)."""
    if not missing:
        return ()
    found: list[tuple[str, str]] = []
    for path in files:
        try:
            text = Path(path).read_text(errors="replace")[:65536]
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition("=")
            program = value.strip().lstrip("@-:+!|").split(maxsplit=1)[:1]
            if key.strip() == "ExecStart" and program and program[0] in missing:
                found.append((path, program[0]))
    return tuple(dict.fromkeys(found))


def refused(plan: Plan, name: str, parameters: dict[str, Any]) -> Executed:
    """toold's error reply to a plan, kept: its name and words on the step it
    names (the first when none), and its reason (unit_not_allowed, ...)."""
    short = name.rpartition(".")[2]
    words = str(parameters.get("message") or parameters.get("reason") or "")
    if not words and parameters.get("unit"):
        words = f"{parameters['unit']} is not allowed"
    message = f"{short}: {words}" if words else short
    reason = str(parameters.get("reason") or ("unit_not_allowed" if short == "UnitNotAllowed"
                                              else short))
    at = parameters.get("step")
    at = at if isinstance(at, int) and 0 <= at < len(plan.steps) else 0
    return Executed(outcome="refused", message=message, refused=reason, steps=[
        StepRecord(tool=step.tool, parameters=dict(step.parameters),
                   outcome="refused" if index == at else "not_run",
                   message=message if index == at else "")
        for index, step in enumerate(plan.steps)])


def _kinds(changes: list[Change]) -> str:
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.kind] = counts.get(change.kind, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none"



