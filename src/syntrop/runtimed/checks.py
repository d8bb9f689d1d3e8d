"""What a call asks for, checked before it takes anything (a model, a slot):
a context's options, sampling, a constraint (compiled here: the worker gets
the grammar), speculative decoding and a session's window. Each failure is
the declared error naming the parameter. Pure but for `constraint`, which
compiles in a thread."""

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING

from syntrop.interfaces.runtime import (
    Constraint,
    InvalidConstraint,
    InvalidSampling,
    NotAuthorized,
    Sampling,
    SessionConfig,
    Speculative,
)
from syntrop.runtimed import protocol
from syntrop.runtimed.config import Config
from syntrop.runtimed.protocol import KV_TYPES, Options
from syntrop.runtimed.residency import check_name
from syntrop.runtimed.sampling import Params, SamplingError, validate
from syntrop.runtimed.sessions import PROMPT_FORMATS
from syntrop.varlink import InvalidParameter, authz

if TYPE_CHECKING:
    from syntrop.runtimed import constrain
    from syntrop.runtimed.journal import Journal

#: Priorities a generation may name (leases.py's lanes).
PRIORITIES = ("EmergencyTriage", "Interactive", "Batch")


async def triage(priority: str | None) -> bool:
    """Whether a request with `priority` goes to the triage lane: only
    EmergencyTriage, and only for root or holders of sentry's triage
    authorization (it is never frozen for anyone)."""
    if priority is None or priority in ("Interactive", "Batch"):
        return False
    if priority not in PRIORITIES:
        raise InvalidParameter(parameter="priority")
    await authz.authorize(authz.TRIAGE, NotAuthorized)
    return True


#: Most tokens drafted per speculative step.
MAX_DRAFT_MAX = 16
#: Journal size of a session with sinks: default and most.
JOURNAL_BYTES = 16384
MAX_JOURNAL_BYTES = 1 << 20


def options(config: SessionConfig | None, defaults: Config, *, embedding: bool = False) -> Options:
    """A context's options: the session's configuration checked, runtimed's
    defaults where it says nothing."""
    c = config or SessionConfig(n_ctx=None, n_batch=None, n_threads=None, n_gpu_layers=None,
                                flash_attn=None, kv_cache_type=None, prompt_format=None,
                                disable_bos=None)
    ranges = (("n_ctx", c.n_ctx, 16, 1 << 17), ("n_batch", c.n_batch, 1, 1 << 14),
              ("n_threads", c.n_threads, 0, 1024), ("n_gpu_layers", c.n_gpu_layers, 0, 1024))
    for parameter, value, low, high in ranges:
        if value is not None and not low <= value <= high:
            raise InvalidParameter(parameter=f"config.{parameter}")
    kv_cache_type = c.kv_cache_type or "f16"
    if kv_cache_type not in KV_TYPES:
        raise InvalidParameter(parameter="config.kv_cache_type")
    if kv_cache_type != "f16" and c.flash_attn is False:
        # llama.cpp quantises the V cache only with flash attention.
        raise InvalidParameter(parameter="config.flash_attn")
    return Options(
        n_ctx=c.n_ctx or defaults.n_ctx,
        n_batch=c.n_batch or 512,
        n_threads=c.n_threads if c.n_threads is not None else defaults.n_threads,
        n_gpu_layers=c.n_gpu_layers or 0,
        flash_attn=bool(c.flash_attn),
        embedding=embedding,
        kv_cache_type=kv_cache_type,
    )


def params(sampling: Sampling | None, n_ctx: int) -> Params:
    """The wire's sampling checked (InvalidSampling) and filled in."""
    s = sampling or Sampling(max_tokens=None, temperature=None, top_p=None, top_k=None,
                             seed=None, stop=None)
    try:
        return validate(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                        top_k=s.top_k, seed=s.seed, stop=s.stop, min_p=s.min_p,
                        reasoning_budget=s.reasoning_budget, logprobs=s.logprobs,
                        n_ctx=n_ctx)
    except SamplingError as error:
        raise InvalidSampling(parameter=error.parameter, reason=error.reason) from None


async def constraint(constraint: Constraint | None) -> "constrain.Constraint | None":
    """Compile a request's constraint (llguidance, jsonschema: imported on
    the first constrained request), or answer InvalidConstraint. The
    worker gets the compiled grammar."""
    if constraint is None:
        return None
    from syntrop.runtimed import constrain

    kinds = [k for k, v in (("json_schema", constraint.json_schema),
                            ("regex", constraint.regex),
                            ("varlink", constraint.interface or constraint.method))
             if v is not None]
    if len(kinds) != 1:
        raise InvalidConstraint(reason="ambiguous", message="set exactly one of json_schema, "
                                "regex, or interface with method")
    try:
        if constraint.json_schema is not None:
            return await asyncio.to_thread(constrain.from_json_schema, constraint.json_schema)
        if constraint.regex is not None:
            return await asyncio.to_thread(constrain.from_regex, constraint.regex)
        if not constraint.interface or not constraint.method:
            raise constrain.ConstraintError("ambiguous", "interface and method go together")
        return await asyncio.to_thread(constrain.from_varlink, constraint.interface,
                                       constraint.method)
    except constrain.ConstraintError as error:
        raise InvalidConstraint(reason=error.reason, message=error.message[:512]) from None


def bounded(params: Params, compiled: "constrain.Constraint | None", n_ctx: int) -> Params:
    """A constrained stream decodes at least its constraint's bound (and
    the end token), so max_tokens never cuts a value short."""
    if compiled is None or compiled.max_tokens is None:
        return params
    return replace(params, max_tokens=min(n_ctx, max(params.max_tokens,
                                                     compiled.max_tokens + 1)))


def thinking(params: Params, compiled: "constrain.Constraint | None") -> None:
    if params.reasoning_budget is not None and compiled is not None:
        raise InvalidConstraint(reason="unsupported", message="a constraint cannot follow "
                                "thinking yet: send constraint or reasoning_budget")


def speculative(sampling: Sampling | None, params: Params,
                 compiled: "constrain.Constraint | None") -> Speculative | None:
    """The request's speculative decoding, checked."""
    spec = sampling.speculative if sampling is not None else None
    if spec is None:
        return None
    if spec.draft_max is not None and not 1 <= spec.draft_max <= MAX_DRAFT_MAX:
        raise InvalidSampling(parameter="speculative.draft_max",
                              reason=f"1 to {MAX_DRAFT_MAX}")
    if spec.draft is not None:
        check_name(spec.draft, "sampling.speculative.draft")
    if compiled is not None:
        raise InvalidConstraint(reason="unsupported", message="a constraint cannot "
                                "follow speculative decoding yet: send one of them")
    if params.reasoning_budget is not None:
        raise InvalidSampling(parameter="speculative",
                              reason="not with a reasoning budget")
    if params.logprobs is not None:
        # The speculative verifier hands no logits row on per token:
        # refused rather than answered without them.
        raise InvalidSampling(parameter="logprobs", reason="not with speculative decoding")
    return spec


def decoding(params: Params, compiled: "constrain.Constraint | None",
             spec: Speculative | None) -> protocol.Decoding:
    """How a worker decodes."""
    return protocol.Decoding(
        params=params, constraint=compiled,
        speculative=None if spec is None else protocol.Speculation(
            draft=spec.draft, draft_max=spec.draft_max))


def prompt_format(config: SessionConfig | None) -> str | None:
    """The prompt format a session declares (sessions.PROMPT_FORMATS), or
    None; the worker checks it against the model's template."""
    declared = config.prompt_format if config is not None else None
    if declared in (None, ""):
        return None
    if declared not in PROMPT_FORMATS:
        raise InvalidParameter(parameter="config.prompt_format")
    return declared


def window(config: SessionConfig | None, n_ctx: int) -> tuple[int | None, "Journal | None"]:
    """A session's sinks and journal, when its configuration asks for them."""
    if config is None or config.sinks is None:
        if config is not None and config.journal_bytes is not None:
            raise InvalidParameter(parameter="config.journal_bytes")
        return None, None
    if not 0 <= config.sinks <= n_ctx // 2:
        raise InvalidParameter(parameter="config.sinks")
    size = JOURNAL_BYTES if config.journal_bytes is None else config.journal_bytes
    if not 1 <= size <= MAX_JOURNAL_BYTES:
        raise InvalidParameter(parameter="config.journal_bytes")
    from syntrop.runtimed.journal import Journal

    return config.sinks, Journal(size)
