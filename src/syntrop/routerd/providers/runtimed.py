"""The local runtimed over Varlink: a Request (routerd/request.py) mapped
to Runtime1.Chat (its turns, sampling, constraint, a handed state) or
Runtime1.Complete, their chunks mapped to OpenAI chat.completion(.chunk)
and text_completion objects."""

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from syntrop.config import Paths
from syntrop.routerd import tools
from syntrop.routerd.config import ProviderConfig
from syntrop.routerd.providers.base import Basics, Capabilities, Handed, ProviderError

if TYPE_CHECKING:
    from syntrop.interfaces.clients import Runtime1Client
    from syntrop.interfaces.runtime import Chunk, Constraint, LoadResult, Sampling, TokenLogprob
    from syntrop.routerd.request import Request

logger = logging.getLogger(__name__)

#: The chat roles runtimed's templates take.
ROLES = ("system", "user", "assistant")
#: The roles a request may use: those, and OpenAI's developer (a system
#: turn) and tool (a result, rewritten as a user turn: routerd/tools.py).
ACCEPTED_ROLES = (*ROLES, "developer", "tool")


def _logprobs(endpoint: str, body: dict[str, Any]) -> int | None:
    """OpenAI's logprobs as runtimed's: chat's `logprobs: true` with
    `top_logprobs` alternatives (0 to 20), completions' `logprobs: N`."""
    value = body.get("logprobs")
    if endpoint == "chat/completions":
        if value is None or value is False:
            if body.get("top_logprobs") is not None:
                raise ProviderError(400, "top_logprobs needs logprobs: true", retryable=False)
            return None
        if value is not True:
            raise ProviderError(400, "logprobs must be a boolean", retryable=False)
        top = body.get("top_logprobs") or 0
    else:
        if value is None:
            return None
        top = value
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
        name = "top_logprobs" if endpoint == "chat/completions" else "logprobs"
        raise ProviderError(400, f"{name} must be an integer from 0 to 20", retryable=False)
    return top


#: reasoning_effort → runtimed's reasoning_budget (thinking tokens at most).
EFFORT_BUDGETS = {"none": 0, "minimal": 0, "low": 256, "medium": 1024, "high": 4096}


def _reasoning_budget(body: dict[str, Any]) -> int | None:
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if effort not in EFFORT_BUDGETS:
        raise ProviderError(400, f"reasoning_effort must be one of "
                                 f"{', '.join(EFFORT_BUDGETS)}", retryable=False)
    return EFFORT_BUDGETS[effort]


def _sampling(endpoint: str, body: dict[str, Any]) -> "Sampling":
    from syntrop.interfaces.runtime import Sampling

    stop = body.get("stop")
    return Sampling(
        max_tokens=body.get("max_tokens") or body.get("max_completion_tokens"),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        top_k=None,
        seed=body.get("seed"),
        stop=[stop] if isinstance(stop, str) else stop,
        logprobs=_logprobs(endpoint, body),
        reasoning_budget=_reasoning_budget(body),
    )


def _chat_logprobs(entries: list[Any]) -> dict[str, Any]:
    """runtimed's TokenLogprobs as a chat choice's logprobs."""
    return {"content": [
        {"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
         "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes}
                          for t in e.top or ()]}
        for e in entries], "refusal": None}


def _text_logprobs(entries: list[Any], offset: int = 0) -> dict[str, Any]:
    """runtimed's TokenLogprobs as a completion choice's (legacy) logprobs;
    `offset`: characters of the text before the first of them."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {"tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.token: t.logprob for t in e.top or ()} for e in entries],
            "text_offset": offsets}


#: OpenAI sampling fields runtimed has no equivalent of, with the value
#: that means "off": any other value is refused rather than ignored.
UNSUPPORTED = {"frequency_penalty": (None, 0), "presence_penalty": (None, 0),
               "logit_bias": (None, {}), "audio": (None,), "prediction": (None,)}


def _unsupported(body: dict[str, Any]) -> None:
    for name, off in UNSUPPORTED.items():
        if body.get(name) not in off:
            raise ProviderError(400, f"runtimed does not support {name}", retryable=False)


def _plan(request: "Request") -> "tools.Plan | None":
    """A chat request's tools (routerd/tools.py); a 400 when malformed or
    asking for what runtimed cannot do."""
    _unsupported(request.body)
    if request.endpoint != "chat/completions":
        return None
    try:
        return tools.plan(request.body, request.response_schema)
    except tools.ToolsError as bad:
        raise ProviderError(400, str(bad), retryable=False) from None


def _constraint(request: "Request", plan: "tools.Plan | None") -> "Constraint | None":
    """runtimed's constraint: the tools' reply schema, else response_format's."""
    from syntrop.interfaces.runtime import Constraint

    schema = plan.schema if plan is not None else request.response_schema
    return None if schema is None else Constraint(json_schema=json.dumps(schema))


def _usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    """OpenAI's usage: runtimed's own counts (the prompt as the model read
    it, chat template included; of it, the tokens a context already held;
    the tokens it generated)."""
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _failed(error: Exception) -> ProviderError:
    """A runtimed call's failure in OpenAI's terms: a refused request 400 (no
    retry elsewhere), a timeout 504, an engine refused after crashing too
    often 503, anything else 502; engine crashes in words."""
    from asyncvarlink import VarlinkErrorReply
    from asyncvarlink.serviceerrors import InvalidParameter

    from syntrop.interfaces.runtime import (
        EngineCrashed,
        EngineFailing,
        InvalidConstraint,
        InvalidSampling,
        in_words,
    )
    from syntrop.varlink.client import CallTimeout

    if isinstance(error, InvalidSampling) and error.p_parameter == "reasoning_budget":
        return ProviderError(400, f"reasoning_effort: this model does not think "
                                  f"({error.p_reason})", retryable=False)
    if isinstance(error, InvalidParameter | InvalidSampling | InvalidConstraint):
        named = (error.p_parameter if isinstance(error, InvalidParameter | InvalidSampling)
                 else error.p_message)
        return ProviderError(400, f"runtimed refused the request: {named} "
                                  f"({type(error).__name__})", retryable=False)
    if isinstance(error, EngineCrashed | EngineFailing):
        words = in_words(error.name, error.parameters) or f"runtimed answered {error.name}"
        return ProviderError(503 if isinstance(error, EngineFailing) else 502, words)
    if isinstance(error, VarlinkErrorReply):
        return ProviderError(502, f"runtimed answered {error.name}")
    if isinstance(error, CallTimeout):
        return ProviderError(504, "runtimed did not answer in time")
    return ProviderError(502, f"runtimed failed: {error}")


def _chat_turns(request: "Request", plan: "tools.Plan | None") -> list[tuple[str, str]]:
    """A chat request's turns (the record's: tools folded in); a 400 for a
    role runtimed does not serve or tools it cannot."""
    for index, message in enumerate(request.body["messages"]):
        if message.get("role") not in ACCEPTED_ROLES:
            raise ProviderError(
                400, f"messages[{index}].role {message.get('role')!r} is not one "
                     f"runtimed serves ({', '.join(ACCEPTED_ROLES)})", retryable=False)
    if request.turns is not None:
        return list(request.turns)
    try:  # the record has none: the reason why
        return tools.messages(request.body, plan)
    except tools.ToolsError as bad:
        raise ProviderError(400, str(bad), retryable=False) from None


@dataclass(slots=True)
class _Whole:
    """One generation, collected."""

    parts: list[str] = field(default_factory=list)
    #: A thinking model's reasoning (chunks runtimed marks thinking).
    thinking: list[str] = field(default_factory=list)
    #: runtimed's TokenLogprobs, when asked for.
    logprobs: "list[TokenLogprob] | None" = None
    tokens: int = 0
    prompt: int = 0
    #: Of the prompt, the tokens a context already held (runtimed's count).
    cached: int | None = None
    finish: str | None = None


class RuntimedProvider(Basics):
    #: Reports its load, runs a real probe, and continues an answer begun
    #: (continue_final_message: Chat's continue_last).
    capabilities = Capabilities(load=True, probe=True, continues=True, prefill=True)

    def __init__(self, config: ProviderConfig, paths: Paths) -> None:
        from syntrop.interfaces.names import RUNTIME  # not the contract: cold start

        self.config = config
        self.address = config.endpoint or f"unix:{paths.socket(RUNTIME)}"

    async def _client(self) -> "Runtime1Client":
        """A connection to runtimed, or a 502 when it cannot be reached."""
        from syntrop.interfaces.runtime import Runtime1
        from syntrop.varlink.client import CallTimeout, connect

        try:
            return await connect(Runtime1, address=self.address, timeout=self.config.timeout)
        except (OSError, CallTimeout) as error:
            raise ProviderError(502, f"runtimed unreachable: {error}") from None

    async def _chunks(self, request: "Request", plan: "tools.Plan | None" = None,
                      handed: Handed | None = None) -> AsyncIterator["Chunk"]:
        """runtimed's chunks; a chat answers from a handed state (taken,
        closed once the answer began: runtimed has its own copy then)."""
        from asyncvarlink import FileDescriptor, VarlinkErrorReply

        from syntrop.interfaces.runtime import ChatMessage
        from syntrop.varlink.client import CallTimeout

        endpoint, body = request.endpoint, request.body
        if endpoint == "chat/completions":
            turns = _chat_turns(request, plan)
        state = handed.take() if handed is not None and endpoint == "chat/completions" \
            else None
        try:
            async with await self._client() as client:
                if endpoint == "chat/completions":
                    messages = [ChatMessage(role=role, content=text) for role, text in turns]
                    open_last = (request.continuation or
                                 bool(body.get("continue_final_message"))) and \
                        bool(turns) and turns[-1][0] == "assistant"
                    replies = client.Chat(model=request.model, messages=messages,
                                          sampling=_sampling(endpoint, body),
                                          constraint=_constraint(request, plan),
                                          continue_last=True if open_last else None,
                                          prefix_state=None if state is None
                                          else FileDescriptor(state))
                else:
                    replies = client.Complete(model=request.model, prompt=str(body["prompt"]),
                                              sampling=_sampling(endpoint, body))
                async for reply in replies:
                    if state is not None:
                        os.close(state)
                        state = None
                    yield reply["chunk"]
        except (VarlinkErrorReply, CallTimeout, OSError) as error:
            raise _failed(error) from None
        finally:
            if state is not None:
                os.close(state)

    async def stream(self, request: "Request",
                     handed: Handed | None = None) -> AsyncGenerator[str, None]:
        endpoint, body = request.endpoint, request.body
        if (body.get("n") or 1) > 1:
            raise ProviderError(400, "runtimed streams one choice: n > 1 needs stream false",
                                retryable=False)
        plan = _plan(request)
        ident = ("chatcmpl-" if endpoint == "chat/completions" else "cmpl-") + os.urandom(8).hex()
        created = int(time.time())
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        tokens = prompt = 0
        cached: int | None = None
        kind = "chat.completion.chunk" if endpoint == "chat/completions" else "text_completion"

        def out(choice: dict[str, Any]) -> str:
            return json.dumps({"id": ident, "object": kind, "created": created,
                               "model": request.model, "choices": [choice],
                               **({"usage": None} if include_usage else {})})

        role: dict[str, Any] = {"role": "assistant"}  # on the first delta only
        calls = tools.ToolStream(plan) if plan is not None else None
        offset = 0  # characters sent, for completions' text_offset
        async for chunk in self._chunks(request, plan, handed):
            tokens += chunk.tokens
            prompt = chunk.prompt_tokens or prompt
            cached = chunk.cached_tokens if chunk.cached_tokens is not None else cached
            entries = chunk.logprobs
            if endpoint != "chat/completions":
                if chunk.thinking:  # a completion's text is the answer alone
                    continue
                choice = {"index": 0, "text": chunk.text, "finish_reason": chunk.finish_reason}
                if entries is not None:
                    choice["logprobs"] = _text_logprobs(entries, offset)
                offset += len(chunk.text)
                yield out(choice)
                continue
            if chunk.thinking:  # a thinking model's reasoning, apart from its answer
                yield out({"index": 0, "delta": {**role, "reasoning_content": chunk.text},
                           "finish_reason": chunk.finish_reason})
                role = {}
                continue
            if calls is None:
                choice = {"index": 0, "delta": {**role, "content": chunk.text},
                          "finish_reason": chunk.finish_reason}
                if entries is not None:
                    choice["logprobs"] = _chat_logprobs(entries)
                yield out(choice)
                role = {}
                continue
            deltas = calls.feed(chunk.text)
            finish = None
            if chunk.finish_reason is not None:
                last, finish = calls.finish(chunk.finish_reason)
                deltas += last
            for delta in deltas or [{}]:
                yield out({"index": 0, "delta": {**role, **delta}, "finish_reason": None})
                role = {}
            if finish is not None:
                yield out({"index": 0, "delta": {}, "finish_reason": finish})
        if include_usage:  # OpenAI's last chunk: no choices, the usage
            yield json.dumps({"id": ident, "object": kind, "created": created,
                              "model": request.model, "choices": [],
                              "usage": _usage(prompt, tokens, cached)})

    async def _embed(self, body: dict[str, Any]) -> dict[str, Any]:
        from asyncvarlink import VarlinkErrorReply

        from syntrop.varlink.client import CallTimeout

        if body.get("dimensions") is not None:
            raise ProviderError(400, "runtimed does not support dimensions", retryable=False)
        texts = body["input"]
        texts = [texts] if isinstance(texts, str) else texts
        client = await self._client()
        async with client:
            try:
                result = await client.Embed(model=body["model"], input=list(texts))
            except (VarlinkErrorReply, CallTimeout, OSError) as error:
                raise _failed(error) from None
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, embedding in enumerate(result["embeddings"]):
            vector: Any = list(embedding.vector)
            if as_base64:
                import base64
                import struct

                vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(len(text) for text in texts) // 4 + len(texts)  # an estimate
        return {"object": "list", "data": data, "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def speak(self, model: str, text: str, voice: str | None,
                    speed: float | None) -> AsyncGenerator[bytes, None]:
        """Runtime1.Speak: the speech's S16LE mono 24 kHz PCM, packet by
        packet as runtimed sends it; runtimed's errors as they come (the
        caller maps them: routerd/speech.py). Closing the generator closes
        the connection, which cancels the call (its worker stops)."""
        import base64

        client = await self._client()
        async with client:
            async for reply in client.Speak(model=model, text=text, voice=voice, speed=speed):
                packet = reply["packet"] if isinstance(reply, dict) else reply
                if packet.audio:
                    yield base64.b64decode(packet.audio)

    async def prefill(self, request: "Request") -> int:
        """A chat request's prompt prefilled (Runtime1.Prefill, the same
        turns Chat would be asked): a memfd of its KV state, the caller's."""
        from asyncvarlink import VarlinkErrorReply

        from syntrop.interfaces.runtime import ChatMessage
        from syntrop.varlink.client import CallTimeout

        turns = _chat_turns(request, _plan(request))
        client = await self._client()
        async with client:
            try:
                with await client.Prefill(model=request.model, messages=[
                        ChatMessage(role=role, content=text) for role, text in turns]) as reply:
                    return os.dup(reply["state"].fileno())
            except (VarlinkErrorReply, CallTimeout, OSError) as error:
                raise _failed(error) from None

    async def load(self) -> "LoadResult | None":
        """runtimed's load now (Runtime1.GetLoad); None when it does not
        answer."""
        from syntrop.interfaces.runtime import Runtime1
        from syntrop.varlink.client import connect

        try:
            async with await connect(Runtime1, address=self.address, timeout=2) as client:
                return await client.GetLoad()
        except Exception:  # unreachable or older runtimed: no verdict
            return None

    async def _collect(self, request: "Request", plan: "tools.Plan | None",
                       handed: Handed | None = None) -> "_Whole":
        whole = _Whole()
        async for chunk in self._chunks(request, plan, handed):
            (whole.thinking if chunk.thinking else whole.parts).append(chunk.text)
            if chunk.logprobs is not None:
                whole.logprobs = (whole.logprobs or []) + list(chunk.logprobs)
            whole.tokens += chunk.tokens
            whole.finish = chunk.finish_reason or whole.finish
            whole.prompt = chunk.prompt_tokens or whole.prompt
            if chunk.cached_tokens is not None:
                whole.cached = chunk.cached_tokens
        return whole

    async def complete(self, request: "Request",
                       handed: Handed | None = None) -> dict[str, Any]:
        endpoint, body = request.endpoint, request.body
        if endpoint == "embeddings":
            return await self._embed(request.sent())
        plan = _plan(request)
        n = body.get("n") or 1
        # n choices: n generations side by side (runtimed's slots batch
        # them), each its own seed when one is given, so they differ.
        seed = body.get("seed")
        wholes = await asyncio.gather(*(
            self._collect(request if seed is None else
                          replace(request, body={**body, "seed": seed + index}),
                          plan, handed) for index in range(n)))
        usage = _usage(wholes[0].prompt, sum(w.tokens for w in wholes), wholes[0].cached)
        choices: list[dict[str, Any]] = []
        asked = _logprobs(endpoint, body) is not None
        for index, whole in enumerate(wholes):
            text, finish = "".join(whole.parts), whole.finish or "stop"
            if endpoint != "chat/completions":
                choices.append({"index": index, "text": text, "finish_reason": finish,
                                "logprobs": _text_logprobs(whole.logprobs or [])
                                if asked else None})
                continue
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if plan is not None:
                message, finish = tools.reply(text, plan, finish)
            if whole.thinking:
                message["reasoning_content"] = "".join(whole.thinking)
            choices.append({"index": index, "finish_reason": finish, "message": message,
                            "logprobs": _chat_logprobs(whole.logprobs or []) if asked
                            else None})
        if endpoint == "chat/completions":
            return {"id": "chatcmpl-" + os.urandom(8).hex(), "object": "chat.completion",
                    "created": int(time.time()), "model": request.model,
                    "choices": choices, "usage": usage}
        return {"id": "cmpl-" + os.urandom(8).hex(), "object": "text_completion",
                "created": int(time.time()), "model": request.model,
                "choices": choices, "usage": usage}

    async def probe(self) -> str:
        """A real check (Router1.TestProvider): runtimed's engine state and a
        one-token completion on the first configured model; what it saw,
        or ProviderError saying what failed."""
        from syntrop.interfaces.runtime import Sampling

        started = time.monotonic()
        client = await self._client()
        try:
            async with client:
                engine = await client.GetEngine()
                where = (f"CPU backend {engine['variant']}" if engine["variant"]
                         else "its built-in CPU backend") + f" on {engine['cpu']}"
                failing = [w for w in engine["workers"] if w.state != "running"]
                if not self.config.models:
                    return f"engine: {where}; no model configured to try"
                model = self.config.models[0]
                tokens = 0
                async for reply in client.Complete(
                        model=model, prompt="Hello",
                        sampling=Sampling(max_tokens=1, temperature=0.0, top_p=None, top_k=None,
                                          seed=1, stop=None)):
                    tokens += reply["chunk"].tokens
        except Exception as error:
            raise _failed(error) from None
        detail = (f"engine: {where}; {model} answered {tokens} token in "
                  f"{(time.monotonic() - started) * 1000:.0f} ms")
        if failing:
            detail += "; " + ", ".join(f"{w.model} {w.state} ({w.last_exit})" for w in failing)
        return detail

    async def list_models(self) -> list[str]:
        """The configured models, once runtimed answers on its socket;
        without a list, every model modeld holds (runtimed loads them from
        there): `name` for a :latest tag, `name:tag` for the others."""
        if self.config.models:
            client = await self._client()
            async with client:
                pass
            return list(self.config.models)
        # Asked of modeld alone: runtimed starts on the first request, not
        # because routerd started.
        from syntrop.interfaces.model import NAME, Model1
        from syntrop.varlink.client import CallTimeout, connect

        address = self.address.removeprefix("unix:")
        modeld = os.path.join(os.path.dirname(address), NAME)
        try:
            async with await connect(Model1, address=modeld, timeout=self.config.timeout) as m:
                models = (await m.List())["models"]
        except Exception as error:  # unreachable, refused, older: no list
            if not isinstance(error, OSError | CallTimeout):
                logger.warning("modeld's model list: %s", error)
            raise ProviderError(502, f"modeld unreachable for the model list: {error}") from None
        return [m.name if m.tag == "latest" else f"{m.name}:{m.tag}"
                for m in sorted(models, key=lambda m: (not m.pinned, m.name, m.tag))]
