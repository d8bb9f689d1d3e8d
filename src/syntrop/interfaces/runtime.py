"""io.syntrop.Runtime1: GGUF inference with persistent sessions (runtimed).

The session methods follow the session contract (Service / Session,
EnsurePrefix → PrefillSuffix → Decode, ContextManifest as cache key, Fence as
owner epoch).
"""

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from asyncvarlink import FileDescriptor, TypedVarlinkErrorReply

from syntrop.interfaces import names
from syntrop.varlink.authz import not_authorized
from syntrop.varlink.contract import Interface, method

NAME = names.RUNTIME


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """Explicit runtime configuration of a session; every knob tested.

    Fields:
        n_ctx: Context window in tokens.
        n_batch: Prefill batch size.
        n_threads: CPU threads; 0 for all.
        n_gpu_layers: Layers offloaded to a GPU; 0 for CPU only.
        flash_attn: Use flash attention.
        kv_cache_type: KV-cache element type: f16 (also empty or null), q8_0
            or q4_0; the quantised types turn on flash attention.
        prompt_format: The prompt format the session's text is written in:
            chatml, gemma, llama3, mistral or raw; null says nothing.
            Checked against the model's chat template when the session
            opens: a model whose template writes another format is
            InvalidParameter config.prompt_format (raw is not checked).
        disable_bos: Do not add a BOS token.
        lora: A LoRA adapter for this session: its name in modeld. Checked
            against the model (architecture, shapes, base name) before any
            token; AdapterMismatch otherwise.
        lora_scale: The adapter's scale, 0 to 4; null for 1. 0 is the
            model without it.
        sinks: Stream past the context window: keep this many first tokens
            (the attention sinks) and, when the window is full, drop the
            oldest tokens after them (half the rest) by shifting the KV
            cache, so Decode runs on with memory bounded. 0 to n_ctx / 2;
            null to stop at the window's end. Models whose cache cannot
            shift answer ShiftUnsupported.
        journal_bytes: With sinks: how many bytes of the latest generated
            text the session keeps (ExplainContext's journal); null for
            16384, at most 1 MiB.
    """

    n_ctx: int | None
    n_batch: int | None
    n_threads: int | None
    n_gpu_layers: int | None
    flash_attn: bool | None
    kv_cache_type: str | None
    prompt_format: str | None
    disable_bos: bool | None
    lora: str | None = None
    lora_scale: float | None = None
    sinks: int | None = None
    journal_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextManifest:
    """The cache key of resident context: reuse is valid only when it matches.

    Fields:
        profile: The caller's profile name.
        model: Model name.
        model_digest: SHA-256 of the weights.
        tokenizer_digest: Digest of the tokenizer.
        template_digest: Digest of the prompt template.
        runtime_digest: Digest of the session configuration.
        bos: BOS policy: add or none.
    """

    profile: str
    model: str
    model_digest: str
    tokenizer_digest: str
    template_digest: str
    runtime_digest: str
    bos: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatMessage:
    """One turn of a chat.

    Fields:
        role: system, user or assistant.
        content: The text.
    """

    role: str
    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Speculative:
    """Speculative decoding: a cheap drafter proposes tokens and the model
    checks them in one batch, keeping what it would have chosen itself
    (greedy: the same text; sampling: the same distribution).

    Fields:
        draft: A draft model's name in modeld (a smaller model with the same
            vocabulary, checked: VocabularyMismatch otherwise); null to
            draft by prompt lookup (continuing an earlier occurrence of the
            last tokens in the context), which pays where the output copies
            the input.
        draft_max: Most tokens drafted per step, 1 to 16; null for 8.
    """

    draft: str | None = None
    draft_max: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """How to pick tokens.

    Fields:
        max_tokens: Stop after this many tokens.
        temperature: 0 for greedy.
        top_p: Nucleus sampling mass.
        top_k: Keep only the k most likely tokens; 0 for all.
        seed: Random seed; the same seed gives the same text.
        stop: Stop sequences.
        min_p: Drop tokens less likely than min_p times the most likely one;
            0 to 1, null for 0.05.
        reasoning_budget: Most thinking tokens (between the model's <think>
            and </think>); at the limit </think> is forced and the answer
            follows. Thinking streams in chunks marked thinking; the markers
            never reach the text. Null for no budget; models without
            single-token markers answer InvalidSampling.
        speculative: Decode speculatively; null for plain decoding. Not
            with a constraint, a reasoning budget or logprobs.
        logprobs: Return each generated token's log-probability and this
            many most likely alternatives (0 to 20); null for none. Not
            with speculative decoding (InvalidSampling).
    """

    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: list[str] | None
    min_p: float | None = None
    reasoning_budget: int | None = None
    speculative: Speculative | None = None
    logprobs: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraint:
    """What the output must be. Set json_schema, or regex, or interface with
    method. The output is then guaranteed to parse and validate: disallowed
    tokens are masked before sampling, and a constrained stream decodes at
    least as many tokens as the longest output of a bounded constraint, so
    max_tokens never cuts a value short.

    Fields:
        json_schema: A JSON Schema, as JSON text: the output is one compact
            JSON value valid against it.
        regex: A regular expression the whole output matches.
        interface: A syntrop interface, e.g. io.syntrop.Tool1; with method,
            the output is a JSON call object {"method": ..., "parameters":
            ...} valid against that method's parameters as the IDL declares
            them (strings at most 128 characters, lists at most 8 items).
        method: The method of interface, e.g. Execute.
    """

    json_schema: str | None = None
    regex: str | None = None
    interface: str | None = None
    method: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TopLogprob:
    """One of the most likely tokens at a position.

    Fields:
        token: The token's text piece (invalid UTF-8 shown as U+FFFD).
        logprob: Natural log of its probability, as TokenLogprob's.
        bytes: The piece's UTF-8 bytes.
    """

    token: str
    logprob: float
    bytes: list[int] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenLogprob:
    """A generated token with its log-probability and the most likely
    alternatives at its position.

    Fields:
        token: The token's text piece, as it adds to the text (invalid
            UTF-8 shown as U+FFFD: a character split across tokens has its
            bytes split too; join bytes for the exact text). Thinking
            markers and special tokens add nothing: "".
        logprob: Natural log of the token's probability under the model's
            own distribution: the log-softmax of the raw logits, before
            temperature, top-k, top-p, min-p, a constraint's mask or a
            reasoning budget's forcing. So it is at most 0, and a token a
            constraint or budget forced may be unlikely here.
        bytes: The piece's UTF-8 bytes.
        top: The sampling.logprobs most likely tokens at this position,
            most likely first (ties: lower token id first); with
            temperature 0 and no constraint the first is the token itself.
            Empty for logprobs 0.
    """

    token: str
    logprob: float
    bytes: list[int] | None
    top: list[TopLogprob] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechPacket:
    """A piece of speech: mono signed 16-bit little-endian PCM at 24,000 Hz.

    Fields:
        audio: The samples, base64; at most 480 (20 ms), empty on the last
            reply.
        samples: Samples it holds.
        sample_rate: 24000.
        sentence: The sentence of the text it belongs to, from 0.
        total_samples: On the last reply: samples sent in all.
    """

    audio: str
    samples: int
    sample_rate: int
    sentence: int
    total_samples: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    """A piece of generated text.

    Fields:
        text: The text delta.
        tokens: Tokens it holds.
        finish_reason: stop, length or cancelled, on the last chunk only.
        thinking: True when the text is the model's thinking, not its answer
            (with a reasoning budget).
        thinking_tokens: On the last chunk, with a reasoning budget: thinking
            tokens generated (markers not counted).
        answer_tokens: On the last chunk, with a reasoning budget: answer
            tokens generated.
        drafted_tokens: On the last chunk, when decoding speculatively:
            tokens the drafter proposed.
        accepted_tokens: On the last chunk, when decoding speculatively:
            drafted tokens the model kept (the acceptance rate is
            accepted_tokens / drafted_tokens).
        shifted_tokens: On the last chunk of a session with sinks: tokens
            dropped from the window by this call's shifts.
        prompt_tokens: On the last chunk of Complete and Chat: tokens of the
            prompt as the model read it (the chat template applied).
        cached_tokens: On the last chunk of Complete and Chat: of those, the
            tokens whose KV a context already held, so they were not
            evaluated again; null where it is not known (the batch layout).
        logprobs: With sampling.logprobs: one entry per token the chunk
            holds (tokens of them), in order; null otherwise and on the
            last chunk. Text held back while it may begin a stop string
            comes in a later chunk than its token's entry, and a stop
            string's own text is cut while its tokens keep their entries:
            join the pieces over the stream, not per chunk.
    """

    text: str
    tokens: int
    finish_reason: str | None
    thinking: bool | None = None
    thinking_tokens: int | None = None
    answer_tokens: int | None = None
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    shifted_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Embedding:
    """The embedding of one text. (A type of its own because systemd's IDL
    parser does not accept nested arrays such as [][]float.)

    Fields:
        vector: L2-normalised vector.
    """

    vector: list[float]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedModel:
    """A model resident in runtimed.

    Fields:
        name: Model name in modeld.
        resident_bytes: Bytes of its weights.
        busy: Streams and embeddings running on it now.
        sessions: Sessions open on it, spilled ones included.
        keep_alive_s: Seconds left before it is unloaded if it stays idle;
            null while it is in use.
        batch_free: With layout batch: sequences free in the model's shared
            decode batch; null when it has none.
        prefixes: Digests of the chat prefixes whose KV its idle contexts
            hold (syntrop.prefix: SHA-256 chained over the turns, 16 hex
            digits), as of its last Chat; routers send a conversation
            where its start is resident. Null before any.
        cached_contexts: Idle contexts holding such a prefix; with
            total_slots, the room left for new prefixes.
    """

    name: str
    resident_bytes: int
    busy: int
    sessions: int
    keep_alive_s: float | None
    batch_free: int | None = None
    prefixes: list[str] | None = None
    cached_contexts: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineVariant:
    """A build of llama.cpp's CPU backend for one feature level.

    Fields:
        name: The variant (x64, haswell, cascadelake, ...).
        score: How well it fits this CPU; 0 where it cannot run here.
    """

    name: str
    score: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EnginePlacement:
    """Where a worker's engine runs, as it applied its model's placement
    (from the model's lease) at load.

    Fields:
        n_gpu_layers: Layer slots on GPUs (llama.cpp's n_gpu_layers): 0 for
            the CPU only, the layer count + 1 for the whole model.
        split_mode: How several GPUs share it: none, layer or row.
        main_gpu: The main GPU's device number.
        tensor_split: Each GPU's share, by device number; null with one
            device or none.
        n_threads: Threads a context loaded then took: the cores free
            (at most the pinned ones).
        cpu_affinity: The CPUs the worker is pinned to; null when it is not
            pinned.
        why: The placement in words.
    """

    n_gpu_layers: int
    split_mode: str
    main_gpu: int
    tensor_split: list[float] | None
    n_threads: int
    cpu_affinity: list[int] | None
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineWorker:
    """A model's engine worker process, or the last one of a model whose
    worker crashed.

    Fields:
        model: The model it serves.
        pid: Its process id; null when none runs.
        state: running, crashed (the next request starts a new one) or
            failing (crashed too often: refused until retry_after_s).
        started_at: When it started, seconds since the epoch; null when
            none runs.
        calls: Calls it has served.
        crashes: Crashes of this model's workers within the crash window.
        last_exit: How the last worker that crashed ended, e.g. "killed by
            signal 11 (SIGSEGV)"; null when none has.
        last_signal: The signal that ended it; null when none did.
        last_calls: What it was serving when it ended.
        retry_after_s: With state failing: seconds until it is tried again.
        lane: triage for the worker of sentry's EmergencyTriage requests
            (never frozen for others), null for the model's main worker.
        lease_id: The inferenced lease its memory is held by; null when it
            runs unleased (inferenced unreachable).
        lease_bytes: Bytes that lease holds: weights, KV cache for every
            slot, compute buffers.
        cgroup: Its own cgroup, which preemption freezes; null where
            runtimed's cgroup is not delegated to it (then it is never
            frozen).
        placement: Where its engine runs, from its lease; null when none
            runs.
    """

    model: str
    pid: int | None
    state: str
    started_at: float | None
    calls: int
    crashes: int
    last_exit: str | None
    last_signal: int | None
    last_calls: list[str]
    retry_after_s: float | None
    lane: str | None = None
    lease_id: str | None = None
    lease_bytes: int | None = None
    cgroup: str | None = None
    placement: EnginePlacement | None = None


class OpenSessionResult(TypedDict):
    session_id: str
    owner_instance_id: str


class PrefixStatus(TypedDict):
    reused_tokens: int
    prefilled_tokens: int
    dropped_tokens: int
    prefix_tokens: int
    resident_tokens: int
    available_tokens: int
    stable_byte_hash: str
    stable_token_hash: str
    manifest_digest: str


class SuffixStatus(TypedDict):
    suffix_tokens: int
    prefix_tokens: int
    resident_tokens: int
    available_tokens: int
    manifest_digest: str


class ContextReport(TypedDict):
    resident_tokens: int
    prefix_tokens: int
    n_ctx: int
    available_tokens: int
    stable_byte_hash: str
    stable_token_hash: str
    manifest_digest: str
    manifest: ContextManifest | None
    closed: bool
    shifted_tokens: int | None
    journal: str | None
    journal_total_bytes: int | None


class EmbedResult(TypedDict):
    embeddings: list[Embedding]
    dimensions: int


class PrefillResult(TypedDict):
    state: FileDescriptor
    tokens: int
    reused_tokens: int
    prefilled_tokens: int


class UnloadResult(TypedDict):
    unloaded: list[str]
    in_use: list[str]
    freed_bytes: int


class LoadResult(TypedDict):
    free_slots: int
    total_slots: int
    resident_bytes: int
    loaded_models: list[str]
    queue_depth: int
    models: list[LoadedModel] | None
    spilled_sessions: int | None


class EngineResult(TypedDict):
    cpu: str
    build: str
    variant: str | None
    variants: list[EngineVariant]
    amx: str
    extra_buffer_types: bool
    reason: str
    system_info: str | None
    workers: list[EngineWorker]


class ModelNotFound(TypedVarlinkErrorReply, interface=NAME):
    """modeld has no such model.

    Parameters:
        model: The model asked for.
    """

    class Parameters:
        model: str


class WeightsMismatch(TypedVarlinkErrorReply, interface=NAME):
    """The weights modeld handed over do not hash to the pinned SHA-256.

    Parameters:
        expected: The pinned digest.
        actual: The digest of the bytes.
    """

    class Parameters:
        expected: str
        actual: str


class InvalidModel(TypedVarlinkErrorReply, interface=NAME):
    """The file is not a GGUF model the engine can load.

    Parameters:
        model: The model.
        reason: What the loader said.
    """

    class Parameters:
        model: str
        reason: str


class NotAVoice(TypedVarlinkErrorReply, interface=NAME):
    """Speak was asked of a model that is no voice (a GGUF language model).

    Parameters:
        model: The model.
    """

    class Parameters:
        model: str


class SessionNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No open session has this identifier.

    Parameters:
        session_id: The identifier asked for.
    """

    class Parameters:
        session_id: str


class StaleOwner(TypedVarlinkErrorReply, interface=NAME):
    """The session belongs to an older owner epoch: another owner took over.

    Parameters:
        session_id: The session.
        owner_instance_id: The current owner.
    """

    class Parameters:
        session_id: str
        owner_instance_id: str


class ContextOverflow(TypedVarlinkErrorReply, interface=NAME):
    """The text does not fit the context window.

    Parameters:
        tokens: Tokens the request needs.
        n_ctx: The context window.
    """

    class Parameters:
        tokens: int
        n_ctx: int


class InvalidSampling(TypedVarlinkErrorReply, interface=NAME):
    """A sampling value is out of range.

    Parameters:
        parameter: The parameter.
        reason: The accepted range.
    """

    class Parameters:
        parameter: str
        reason: str


class AdapterMismatch(TypedVarlinkErrorReply, interface=NAME):
    """A LoRA adapter that is not one, or was made for another base model.

    Parameters:
        adapter: The adapter's name in modeld.
        reason: What does not match.
    """

    class Parameters:
        adapter: str
        reason: str


class InvalidConstraint(TypedVarlinkErrorReply, interface=NAME):
    """A constraint that cannot be built; answered before any token.

    Parameters:
        reason: invalid_schema, invalid_regex, unknown_interface,
            unknown_method, unsupported or ambiguous (not exactly one kind
            set).
        message: What is wrong, in words.
    """

    class Parameters:
        reason: str
        message: str


class VocabularyMismatch(TypedVarlinkErrorReply, interface=NAME):
    """The draft model tokenizes differently from the model; answered
    before any token.

    Parameters:
        draft: The draft model.
        reason: What differs.
    """

    class Parameters:
        draft: str
        reason: str


class ShiftUnsupported(TypedVarlinkErrorReply, interface=NAME):
    """The model's KV cache cannot shift positions (multi-section rotary
    positions, recurrent state), so it cannot stream past its window.

    Parameters:
        model: The model.
    """

    class Parameters:
        model: str


class NoPrefix(TypedVarlinkErrorReply, interface=NAME):
    """Decode or PrefillSuffix before EnsurePrefix.

    Parameters:
        session_id: The session.
    """

    class Parameters:
        session_id: str


class Busy(TypedVarlinkErrorReply, interface=NAME):
    """Every slot is taken and the queue is full.

    Parameters:
        queue_depth: Requests waiting.
    """

    class Parameters:
        queue_depth: int


class EngineCrashed(TypedVarlinkErrorReply, interface=NAME):
    """The model's engine worker died while serving the call (a native
    fault in llama.cpp, an OOM kill) or could not start. runtimed and other
    models go on; the next request starts a new worker.

    Parameters:
        model: The model.
        signal: The signal that ended the worker, e.g. 11 (SIGSEGV); null
            when it exited by itself.
        exit_status: Its exit status when no signal ended it, else null.
        reason: What happened, in words.
    """

    class Parameters:
        model: str
        signal: int | None
        exit_status: int | None
        reason: str


class EngineFailing(TypedVarlinkErrorReply, interface=NAME):
    """The model's engine crashed crash_limit times within the crash window:
    runtimed does not start it again until the oldest crash leaves it.

    Parameters:
        model: The model.
        crashes: Crashes within the window.
        window_s: The window, in seconds.
        retry_after_s: Seconds until a request starts it again.
        reason: How the last worker ended.
    """

    class Parameters:
        model: str
        crashes: int
        window_s: float
        retry_after_s: float
        reason: str


class InsufficientMemory(TypedVarlinkErrorReply, interface=NAME):
    """inferenced would not lease the memory the model needs on the plane it
    runs on (idle models were unloaded first, and it was asked again).

    Parameters:
        model: The model.
        plane: The plane, e.g. cpu.
        needed_bytes: What the model needs resident: weights, KV cache for
            every slot, compute buffers.
        available_bytes: What the plane could give; null when refused for
            pressure.
        reason: ResourceExhaustion, PressureTooHigh or PlaneQuarantined.
    """

    class Parameters:
        model: str
        plane: str
        needed_bytes: int
        available_bytes: int | None
        reason: str


class SessionLost(TypedVarlinkErrorReply, interface=NAME):
    """The session's context lived in an engine worker that died; its
    state is gone and is never rebuilt silently. Close it and open a new one.

    Parameters:
        session_id: The session.
        model: Its model.
        reason: How the worker ended.
    """

    class Parameters:
        session_id: str
        model: str
        reason: str


def in_words(name: str, parameters: Mapping[str, Any]) -> str | None:
    """A Runtime1 error a person can act on, for clients that print it
    (syn run, routerd's error bodies); None for errors without words here."""
    error = name.rsplit(".", 1)[-1]
    model = parameters.get("model", "?")
    if error == "EngineCrashed":
        number = parameters.get("signal")
        if number is not None:
            import signal

            try:
                named = f", {signal.Signals(number).name}"
            except ValueError:
                named = ""
            return f"runtimed's engine for {model} crashed (signal {number}{named})"
        if parameters.get("exit_status") is not None:
            return f"runtimed's engine for {model} exited with status {parameters['exit_status']}"
        reason = parameters.get("reason", "no reason given")
        return f"runtimed's engine for {model} failed: {reason}"
    if error == "EngineFailing":
        return (f"runtimed's engine for {model} crashed {parameters.get('crashes')} times in "
                f"{parameters.get('window_s', 0):g} s ({parameters.get('reason')}); "
                f"runtimed tries it again in {parameters.get('retry_after_s', 0):g} s")
    if error == "SessionLost":
        return (f"session {parameters.get('session_id')} was lost with runtimed's engine for "
                f"{model} ({parameters.get('reason')}): open a new one")
    if error == "ModelNotFound":
        return f"modeld has no model named {model} (syn list shows them, syn pull adds one)"
    if error == "InsufficientMemory":
        mib = 1 << 20
        available = parameters.get("available_bytes")
        left = f", {available / mib:.0f} MiB available" if available is not None else ""
        return (f"{model} needs {parameters.get('needed_bytes', 0) / mib:.0f} MiB on plane "
                f"{parameters.get('plane')}{left} ({parameters.get('reason')}): free memory "
                "there, or lower runtimed's slots or n_ctx")
    return None


NotAuthorized = not_authorized(NAME)


class Runtime1(Interface, name=NAME):
    """Runs GGUF models: completion and chat streams, embeddings, and
    persistent sessions that reuse their resident prefix."""

    errors = (
        ModelNotFound,
        WeightsMismatch,
        InvalidModel,
        NotAVoice,
        SessionNotFound,
        StaleOwner,
        ContextOverflow,
        InvalidSampling,
        InvalidConstraint,
        AdapterMismatch,
        VocabularyMismatch,
        ShiftUnsupported,
        NoPrefix,
        Busy,
        EngineCrashed,
        EngineFailing,
        SessionLost,
        InsufficientMemory,
        NotAuthorized,
    )

    @method(return_parameter="chunk")
    def Complete(
        self, *, model: str, prompt: str, sampling: Sampling | None = None,
        constraint: Constraint | None = None, priority: str | None = None,
    ) -> AsyncIterator[Chunk]:
        """Continue a prompt. Call with "more" to stream.

        Parameters:
            model: Model name in modeld.
            prompt: The text to continue.
            sampling: How to pick tokens.
            constraint: What the output must be; null for free text.
            priority: Interactive (null) or Batch: the model's main worker,
                which an emergency may freeze; EmergencyTriage (root or the
                sentry.triage authorization): a worker of its own, never
                frozen for others.

        Returns:
            chunk: The next piece of text.
        """

    @method(return_parameter="chunk")
    def Chat(
        self, *, model: str, messages: list[ChatMessage], sampling: Sampling | None = None,
        constraint: Constraint | None = None, priority: str | None = None,
        continue_last: bool | None = None, prefix_state: FileDescriptor | None = None,
    ) -> AsyncIterator[Chunk]:
        """Answer a chat with the model's own template. Call with "more".

        Parameters:
            model: Model name in modeld.
            messages: The conversation so far.
            sampling: How to pick tokens.
            constraint: What the output must be; null for free text.
            priority: As Complete's.
            continue_last: The last message is an answer begun (role
                assistant): continue it, its turn left open, rather than
                answer after it (a stream resumed on another node).
            prefix_state: A Prefill's state of this chat's prompt (another
                node's prefill hand-off; root, runtimed's own user or the
                runtime.manage authorization): restored instead of
                prefilling what it holds. Either a memfd sealed against
                writes, shrinking and growth, or a pipe or socket that
                runtimed reads to its end into a memfd of its own (the
                caller writes the state in as it comes, holding none of
                it). A state of another prompt, one cut short, or one that
                does not fit (more bytes than the model's context can
                hold) is not used (the prompt is prefilled).

        Returns:
            chunk: The next piece of the answer.
        """

    @method
    def Prefill(self, *, model: str, messages: list[ChatMessage]) -> PrefillResult:
        """Prefill a chat's prompt but its last token, 1024 tokens per step,
        and hand out its KV state, for a node busy decoding to answer it
        from (Chat's prefix_state): the fleet's prefill hand-off. Root,
        runtimed's own user or the runtime.manage authorization.

        Parameters:
            model: Model name in modeld.
            messages: The conversation, as Chat will be asked it.

        Returns:
            state: A memfd: the token count (8 bytes, little-endian), the
                tokens (4 bytes each), then llama.cpp's sequence state.
            tokens: Tokens the state holds.
            reused_tokens: Of those, what a context here held already.
            prefilled_tokens: Of those, what was computed now.
        """

    @method
    def Embed(self, *, model: str, input: list[str]) -> EmbedResult:
        """L2-normalised embeddings of a batch of texts.

        Parameters:
            model: Model name in modeld.
            input: The texts.

        Returns:
            embeddings: One vector per text, in order.
            dimensions: Length of each vector.
        """

    @method(return_parameter="packet")
    def Speak(
        self, *, model: str, text: str, voice: str | None = None, speed: float | None = None,
    ) -> AsyncIterator[SpeechPacket]:
        """Speak a text with a voice model (an ONNX voice in modeld), sentence
        by sentence: the first packets come while later sentences are still
        being synthesized. Call with "more".

        Parameters:
            model: Voice name in modeld.
            text: What to say: 1 to 4,096 characters.
            voice: A speaker of a voice that has several; null for its first.
            speed: 0.5 to 2.0 times the voice's pace; null for 1.

        Returns:
            packet: The next 20 ms (or less) of speech; the last reply has no
                audio and the total.
        """

    @method
    def OpenSession(
        self, *, owner_instance_id: str, model: str, config: SessionConfig | None = None,
        priority: str | None = None,
    ) -> OpenSessionResult:
        """Open a persistent session bound to an owner epoch; a newer owner
        invalidates older sessions.

        Parameters:
            owner_instance_id: The owner (fence) the caller expects.
            model: Model name in modeld.
            config: Runtime configuration; defaults when null.
            priority: As Complete's: Interactive (null) or Batch, the
                model's main worker; EmergencyTriage (root or the
                sentry.triage authorization), the triage lane's worker,
                never frozen for others, and the session is never spilled.

        Returns:
            session_id: The session.
            owner_instance_id: The owner it is bound to.
        """

    @method
    def EnsurePrefix(
        self, *, session_id: str, text: str, manifest: ContextManifest
    ) -> PrefixStatus:
        """Make the resident context equal the stable prefix, reusing the
        longest resident matching token prefix and prefilling only the rest.

        Parameters:
            session_id: The session.
            text: The stable prefix.
            manifest: The cache key; a change forces a full prefill.

        Returns:
            reused_tokens: Tokens kept from before (a warm hit when > 0).
            prefilled_tokens: Tokens computed now.
            dropped_tokens: Resident tokens discarded.
            prefix_tokens: Tokens of the prefix.
            resident_tokens: Tokens resident now.
            available_tokens: Tokens left in the context window.
            stable_byte_hash: SHA-256 of the prefix text.
            stable_token_hash: SHA-256 of the prefix tokens.
            manifest_digest: Digest of the manifest.
        """

    @method
    def PrefillSuffix(
        self, *, session_id: str, text: str, manifest: ContextManifest
    ) -> SuffixStatus:
        """Add the volatile suffix after the prefix, leaving the prefix alone.

        Parameters:
            session_id: The session.
            text: The volatile text (a diff, test output, a user turn).
            manifest: Must match the prefix's manifest.

        Returns:
            suffix_tokens: Tokens of the suffix.
            prefix_tokens: Tokens of the prefix.
            resident_tokens: Tokens resident now.
            available_tokens: Tokens left in the context window.
            manifest_digest: Digest of the manifest.
        """

    @method(return_parameter="chunk")
    def Decode(
        self, *, session_id: str, sampling: Sampling | None = None,
        constraint: Constraint | None = None,
    ) -> AsyncIterator[Chunk]:
        """Generate from the resident context. Call with "more".

        Parameters:
            session_id: The session.
            sampling: How to pick tokens.
            constraint: What the output must be; null for free text.

        Returns:
            chunk: The next piece of text.
        """

    @method
    def ExplainContext(self, *, session_id: str) -> ContextReport:
        """Report what the session holds.

        Parameters:
            session_id: The session.

        Returns:
            resident_tokens: Tokens resident.
            prefix_tokens: Tokens of the stable prefix.
            n_ctx: The context window.
            available_tokens: Tokens left.
            stable_byte_hash: SHA-256 of the prefix text.
            stable_token_hash: SHA-256 of the prefix tokens.
            manifest_digest: Digest of the manifest.
            manifest: The manifest; null before the first EnsurePrefix.
            closed: Whether the session is closed.
            shifted_tokens: With sinks: tokens dropped from the window so
                far; null without.
            journal: With sinks: the latest generated text, at most
                journal_bytes; null without.
            journal_total_bytes: With sinks: bytes generated in all.
        """

    @method
    def Close(self, *, session_id: str) -> None:
        """Close a session and free its slot.

        Parameters:
            session_id: The session.
        """

    @method
    def Unload(self, *, model: str | None = None) -> UnloadResult:
        """Unload resident models that nothing uses now (no stream, embedding
        or open session), closing their contexts and modeld's descriptors;
        the next request loads them again. runtimed does the same by itself
        when a model outlives its keep-alive, or under memory pressure.

        Parameters:
            model: The model; null for every idle one.

        Returns:
            unloaded: Models unloaded now.
            in_use: Models kept because something uses them.
            freed_bytes: Bytes of weights no longer resident.
        """

    @method
    def GetEngine(self) -> EngineResult:
        """Which CPU code the engine runs on this host and why, and the
        state of every model's engine worker.

        Returns:
            cpu: The CPU's model name.
            build: variants (a CPU backend per feature level, chosen at run
                time) or single (one backend built in).
            variant: The variant chosen; null for a single build.
            variants: Each variant and its score on this CPU.
            amx: Whether AMX is advertised, granted and working, in words.
            extra_buffer_types: Whether llama.cpp may repack weights into
                its extra buffer types (off where AMX is advertised but
                faults and the build cannot leave it out).
            reason: Why this choice.
            system_info: What llama.cpp reports of itself, from a running
                worker; null when none runs.
            workers: Each model's engine worker.
        """

    @method
    def GetLoad(self) -> LoadResult:
        """How busy runtimed is, for routers.

        Returns:
            free_slots: Slots free now.
            total_slots: Slots configured.
            resident_bytes: Bytes of models resident.
            loaded_models: Models resident.
            queue_depth: Requests waiting for a slot.
            models: Each resident model with its keep-alive left.
            spilled_sessions: Idle sessions whose state is parked in host
                memory or on disk, holding no slot.
        """
