"""The engine: one llama.cpp context (llama-cpp-python's `Llama`) per slot.

Everything here blocks, and runs only in an engine worker process (worker/loop.py,
host.py), on a thread per request; runtimed's own process never imports
llama_cpp. llama_cpp is imported inside the functions that need it.

Weights arrive as a descriptor from modeld, checked by runtimed (models.py);
`Engine.load` opens them through /proc/self/fd/N, so no process needs access
to the store's paths. The worker keeps the descriptor open while the model
is resident: modeld counts an open descriptor as "in use".

Concurrency: one Engine serves one request at a time (`lock`); generation
checks a `threading.Event` before every token, so a client that goes away
stops the engine within one token. Several engines run side by side; a
`Pace` (layout.py) sets each one's thread count, token by token.

Sessions can be spilled: `save` copies the KV cache of the context's one
sequence out (llama.cpp's per-sequence state API, not `Llama.save_state`,
which also copies the whole logits array) and `restore` puts it into a fresh
context, so the session continues warm.
"""

import codecs
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from syntrop.runtimed.layout import Pace
from syntrop.runtimed.protocol import KV_TYPES, Options, Placed
from syntrop.runtimed.sampling import MAX_SEED, Params, StopScanner
from syntrop.runtimed.sessions import common_prefix
from syntrop.runtimed.worker.logprobs import Entry, Scorer

if TYPE_CHECKING:
    from syntrop.runtimed.constrain import Constraint
    from syntrop.runtimed.worker.reasoning import Reasoning
    from syntrop.runtimed.worker.sinks import Window


class EngineError(Exception):
    """Base of engine errors."""


class LoadError(EngineError):
    """The file is not a model llama.cpp can load."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Overflow(EngineError):
    """The tokens do not fit the context window."""

    def __init__(self, tokens: int, n_ctx: int) -> None:
        super().__init__(f"{tokens} tokens, context {n_ctx}")
        self.tokens = tokens
        self.n_ctx = n_ctx


@dataclass(frozen=True, slots=True)
class Saved:
    """A context's sequence state, copied out: its tokens and KV bytes (a
    writable view restores without a copy)."""

    tokens: list[int]
    data: bytes | memoryview


class Emit(Protocol):
    """Receives a piece of text, its tokens and, when the stream asked for
    them, their logprob entries (logprobs.Entry), one per token."""

    def __call__(self, text: str, tokens: int,
                 logprobs: "list[dict[str, Any]] | None" = None) -> None: ...


#: Receives thinking text and its tokens (markers: "" and their count), as
#: Emit does.
Think = Emit


class Output:
    """Sampled tokens → a stream's pieces, the same for every way of
    decoding: UTF-8 decoded across token boundaries, text that may begin a
    stop string held back until decided, and with `reasoning` the thinking
    sent to `think` apart from the answer, markers to neither. With
    `logprobs` (the alternatives wanted), every token comes with the logits
    row it was sampled from and each piece with its tokens' entries."""

    def __init__(self, llama: Any, emit: Emit, stops: tuple[str, ...],
                 reasoning: "Reasoning | None" = None, think: Think | None = None,
                 logprobs: int | None = None) -> None:
        self._llama = llama
        self._emit = emit
        self._scanner = StopScanner(stops)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._thought = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._reasoning = reasoning
        self._think = think
        self._pending = 0
        #: With logprobs: the entries of the pending tokens.
        self._scorer: Scorer | None = None
        self._entries: list[Entry] = []
        if logprobs is not None:
            self._scorer = Scorer(self._piece, logprobs)
        #: Tokens taken so far; whether a stop string ended the text.
        self.count = 0
        self.stopped = False

    @property
    def scoring(self) -> bool:
        """Whether `token` wants each token's logits row."""
        return self._scorer is not None

    def _piece(self, token: int) -> bytes:
        return bytes(self._llama.detokenize([token], special=False))

    def _send(self, text: str) -> None:
        if self._scorer is None:
            self._emit(text, self._pending)
        else:
            entries, self._entries = self._entries, []
            self._emit(text, self._pending, entries)
        self._pending = 0

    def eog(self, token: int) -> bool:
        """Whether `token` ends generation (it is not text)."""
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(self._llama._model.vocab, token))

    def token(self, token: int, logits: Any = None) -> bool:
        """Take one generated token (with `scoring`, and the logits row it
        was sampled from); False when a stop string ended the text."""
        from syntrop.runtimed.worker.reasoning import ANSWER, THINKING

        self.count += 1
        if self._reasoning is not None and (kind := self._reasoning.feed(token)) != ANSWER:
            if self._think is not None:
                piece = self._piece(token) if kind == THINKING else b""
                if self._scorer is None:
                    self._think(self._thought.decode(piece), 1)
                else:
                    self._think(self._thought.decode(piece), 1,
                                [self._scorer.entry(logits, token, piece)])
            return True
        self._pending += 1
        piece = self._piece(token)
        if self._scorer is not None:
            self._entries.append(self._scorer.entry(logits, token, piece))
        text = self._decoder.decode(piece)
        safe, self.stopped = self._scanner.feed(text)
        if safe:
            self._send(safe)
        return not self.stopped

    def close(self) -> None:
        """Send what is held back (unless a stop string ended the text) and
        the count of tokens not yet reported."""
        if not self.stopped:
            tail = self._scanner.flush() + self._decoder.decode(b"", final=True)
            if tail:
                self._send(tail)
        if self._pending:
            self._send("")


def llama_kwargs(fd: int, options: Options, placed: Placed, *, free: int,
                 vocab_only: bool = False) -> dict[str, Any]:
    """llama_cpp.Llama's keyword arguments for a context of `options` on
    the model behind `fd`, where `placed` puts it: its device settings (a
    context asking for fewer GPU layers gets fewer, never more), and
    threads: the context's own count, else `free` (the plane's cores,
    cpu.plane_threads), at most the placement's."""
    n_gpu_layers = placed.n_gpu_layers
    if options.n_gpu_layers:
        n_gpu_layers = min(n_gpu_layers, options.n_gpu_layers)
    return {
        "model_path": f"/proc/self/fd/{fd}",
        "n_ctx": options.n_ctx,
        "n_batch": options.n_batch,
        **placed.llama_kwargs(max(1, options.n_threads or free)),
        "n_gpu_layers": n_gpu_layers,
        "flash_attn": options.flash_attn or options.kv_cache_type != "f16",
        "type_k": KV_TYPES[options.kv_cache_type],
        "type_v": KV_TYPES[options.kv_cache_type],
        "embedding": options.embedding,
        # Mean pooling (1): one vector per text even for causal models;
        # otherwise the model's own (-1, unspecified).
        "pooling_type": 1 if options.embedding else -1,
        "vocab_only": vocab_only,
        "verbose": False,
    }


class Engine:
    """One loaded llama.cpp model and context."""

    def __init__(self, llama: Any, threads: int = 1) -> None:
        self._llama = llama
        #: The last token a generation handed out without evaluating it
        #: (the next step would have): a session's next Decode starts with
        #: it, so its context holds all the text it was given.
        self.pending: int | None = None
        #: The chat prefixes whose KV this context holds, as
        #: syntrop.prefix.reported digests (the pool keeps them).
        self.prefixes: tuple[str, ...] = ()
        self.lock = threading.Lock()
        #: The most threads this context may use, and what it uses now.
        self.max_threads = threads
        self._threads = threads
        #: The weights this context runs on when they are shared (`Weights`):
        #: closing it then frees its context only.
        self.weights: Weights | None = None

    @classmethod
    def load(cls, fd: int, options: Options, *, vocab_only: bool = False,
             placed: Placed | None = None) -> "Engine":
        """Load the model behind `fd` (kept open by the caller) where
        `placed` says (None: the CPU, every core); with `vocab_only`,
        its vocabulary and metadata only: a context that tokenizes and
        renders chats, and cannot decode."""
        from llama_cpp import Llama

        from syntrop.runtimed.cpu import plane_threads, ready

        ready()
        kwargs = llama_kwargs(fd, options, placed or Placed(),
                              free=0 if options.n_threads else plane_threads(),
                              vocab_only=vocab_only)
        try:
            llama = Llama(**kwargs)
        except (ValueError, RuntimeError, OSError) as error:
            raise LoadError(str(error) or type(error).__name__) from None
        return cls(llama, int(kwargs["n_threads"]))

    def use_threads(self, threads: int) -> None:
        """Decode and prefill with `threads` threads from now on."""
        if threads != self._threads:
            import llama_cpp

            llama_cpp.llama_set_n_threads(self._llama._ctx.ctx, threads, threads)
            self._threads = threads

    @property
    def llama(self) -> Any:
        """llama-cpp-python's `Llama` (for the decoding modules)."""
        return self._llama

    @property
    def n_ctx(self) -> int:
        # llama.cpp may round the context up (to 256); the library's token
        # buffers keep the size asked for. The smaller one is the limit.
        return min(int(self._llama.n_ctx()), len(self._llama.input_ids))

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self._llama.metadata)

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        return list(self._llama.tokenize(text.encode(), add_bos=add_bos, special=special))

    def chat_prompt(self, messages: Sequence[tuple[str, str]], *, continue_last: bool = False,
                    ) -> tuple[list[int], tuple[str, ...]]:
        """Render a chat with the model's own template (GGUF metadata
        `tokenizer.chat_template`), tokenized, and the template's stops.
        With `continue_last`, the last message (an assistant's answer begun)
        is left open: rendered without a generation prompt and cut right
        after its text, so generation continues it (what transformers calls
        continue_final_message); ValueError when the rendered chat does not
        hold that text as given."""
        from syntrop.runtimed.worker.templates import ChatFormatter

        template = self.metadata.get("tokenizer.chat_template")
        if template is None:
            raise LoadError("the model has no chat template")
        from jinja2 import TemplateError

        model = self._llama._model
        eos, bos = self._llama.token_eos(), self._llama.token_bos()
        turns: Any = [{"role": r, "content": c} for r, c in messages]
        try:
            formatter = ChatFormatter(
                template=template,
                eos_token=model.token_get_text(eos) if eos != -1 else "",
                bos_token=model.token_get_text(bos) if bos != -1 else "",
                add_generation_prompt=not continue_last,
            )
            response = formatter(messages=turns)
        except (TemplateError, OverflowError) as error:
            # The GGUF's template is attacker text: the sandbox's refusals
            # (unsafe attributes, huge ranges, operators that would make
            # too much: templates.BoundedSandbox) and its syntax errors are
            # the model's fault, answered as such.
            raise LoadError(f"the chat template failed: {str(error)[:200]}") from None
        if continue_last:
            text = messages[-1][1]
            at = response.prompt.rfind(text) if text else -1
            if at < 0:
                raise ValueError("the chat template does not show the answer to continue")
            response.prompt = response.prompt[:at + len(text)]
        stop = response.stop
        stops = tuple(s for s in ([stop] if isinstance(stop, str) else stop or []) if s)
        tokens = self.tokenize(response.prompt, add_bos=not response.added_special)
        return tokens, stops

    def check_fits(self, tokens: int) -> None:
        if tokens >= self.n_ctx:
            raise Overflow(tokens, self.n_ctx)

    def resident(self) -> list[int]:
        """Tokens whose KV is resident now."""
        return [int(t) for t in self._llama.input_ids[: self._llama.n_tokens]]

    def continuation(self) -> list[int]:
        """What a session's next generation follows: the resident tokens and
        the last one handed out, if it was not evaluated."""
        return self.resident() + ([self.pending] if self.pending is not None else [])

    def prefill(self, keep: int, tokens: Sequence[int], pace: Pace | None = None) -> None:
        """Keep the first `keep` resident tokens, drop the rest, evaluate
        `tokens` after them."""
        llama = self._llama
        self.check_fits(keep + len(tokens))
        self.pending = None
        llama.n_tokens = keep
        llama._ctx.kv_cache_seq_rm(-1, keep, -1)
        if tokens:
            pace = pace or Pace("threads", self.max_threads)
            with pace.running(), pace.turn():
                self.use_threads(pace.threads(self.max_threads))
                llama.eval(list(tokens))
        else:
            # The logits now belong to a dropped token: refresh before sampling.
            llama._requires_eval = True

    def save(self) -> Saved:
        """Copy the resident tokens and their KV cache out of the context
        (sequence 0, the only one)."""
        import ctypes

        import llama_cpp

        if self.pending is not None:
            # The saved state must hold every token the session was given.
            if self._llama.n_tokens < self.n_ctx:
                self._llama.eval([self.pending])
            self.pending = None
        ctx = self._llama._ctx.ctx
        size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
        buffer = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0))
        if written != size:
            raise EngineError(f"sequence state: {written} of {size} bytes copied")
        return Saved(tokens=self.resident(), data=bytes(buffer))

    def restore(self, saved: Saved) -> None:
        """Put a saved sequence into this (fresh) context; the next
        generation re-evaluates only the last token, for its logits."""
        import ctypes

        import llama_cpp

        self.check_fits(len(saved.tokens))
        llama = self._llama
        kind = ctypes.c_uint8 * len(saved.data)
        writable = isinstance(saved.data, memoryview) and not saved.data.readonly
        source = kind.from_buffer(saved.data) if writable else kind.from_buffer_copy(saved.data)
        if not llama_cpp.llama_state_seq_set_data(llama._ctx.ctx, source, len(saved.data), 0):
            raise EngineError("the saved sequence state does not fit this context")
        count = len(saved.tokens)
        llama.input_ids[:count] = saved.tokens
        llama.n_tokens = count
        llama._requires_eval = True
        self.pending = None

    def generate(self, tokens: Sequence[int], params: Params, stop: threading.Event,
                 emit: Emit, *, extra_stops: tuple[str, ...] = (), pace: Pace | None = None,
                 logits_processor: Any = None, first: Callable[[], None] | None = None,
                 reasoning: "Reasoning | None" = None, think: Think | None = None,
                 window: "Window | None" = None) -> str:
        """Generate after `tokens`, reusing whatever prefix of them is
        resident. Calls `emit(text, tokens)` per piece; returns the finish
        reason: stop, length or cancelled. `pace` sets the thread count and
        turns per token; `logits_processor` (llama-cpp-python's) goes to the
        sampler; `first` is called when the first token is sampled. With
        `reasoning` (see `reasoning()`), thinking goes to `think` instead of
        `emit`, markers to neither, and the budget is enforced. With
        `window` (and no processor), generation slides past the context
        instead of stopping at its end (`shift`)."""
        pace = pace or Pace("threads", self.max_threads)
        if reasoning is not None:
            from llama_cpp import LogitsProcessorList

            logits_processor = LogitsProcessorList([*(logits_processor or []), reasoning])
        with pace.running():
            return self._generate(tokens, params, stop, emit, extra_stops, pace,
                                  logits_processor, first, reasoning, think, window)

    def reasoning(self, budget: int | None) -> "Reasoning":
        """A thinking budget for one generation on this model; ReasoningError
        when the model has no single-token <think> and </think>."""
        import llama_cpp

        from syntrop.runtimed.worker.reasoning import Reasoning, markers

        start, end = markers(self._llama)
        vocab = self._llama._model.vocab
        eog = {llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)} - {-1}
        return Reasoning(start=start, end=end, budget=budget, eog=sorted(eog))

    def _generate(self, tokens: Sequence[int], params: Params, stop: threading.Event,
                  emit: Emit, extra_stops: tuple[str, ...], pace: Pace,
                  logits_processor: Any, first: Callable[[], None] | None,
                  reasoning: "Reasoning | None" = None, think: Think | None = None,
                  window: "Window | None" = None) -> str:
        llama = self._llama
        # The processors (constraint, reasoning) count the context's tokens
        # from their first call on: they allow a shift before it, not after.
        sliding = window is not None and logits_processor is None
        self.pending = None
        if window is not None:
            # Room first: one token to slide on from, or the whole answer
            # (as far as the window holds it) when it cannot slide later.
            need = 1 if sliding else min(params.max_tokens + 1, self.n_ctx - window.sinks - 1)
            if len(tokens) + need > self.n_ctx:
                # `tokens` is the resident context and what follows it.
                tail = list(tokens[self._llama.n_tokens:])
                self.shift(window, need + len(tail))
                tokens = self.resident() + tail
        self.check_fits(len(tokens))
        budget = params.max_tokens if sliding else min(params.max_tokens,
                                                       self.n_ctx - len(tokens))
        llama.set_seed(params.seed)
        output = Output(llama, emit, params.stop + extra_stops, reasoning, think,
                        params.logprobs)
        row = self._last_logits if output.scoring else None
        if not self._prefill_paced(tokens, pace, stop):
            return "cancelled"
        tokens_out = self._sample(tokens, params, logits_processor)
        reason = "length"
        produced = 0
        token: int | None = None
        while True:
            if sliding and token is not None and llama.n_tokens >= self.n_ctx:
                # The last token is sampled, not yet evaluated, and the window
                # is full: slide it and go on from the same place.
                assert window is not None
                tokens_out.close()
                self.shift(window, 1)
                llama.set_seed((params.seed + window.shifts) % (MAX_SEED + 1))
                tokens_out = self._sample([*self.resident(), token], params, None)
            with pace.turn():
                self.use_threads(pace.threads(self.max_threads))
                token = next(tokens_out, None)
            if token is None:
                reason = "stop"
                break
            produced += 1
            if produced == 1 and first is not None:
                first()
            if stop.is_set():
                reason = "cancelled"
                break
            if output.eog(token) or \
                    not output.token(token, None if row is None else row()):
                reason = "stop"
                break
            if produced >= budget:
                break
        output.close()
        # Handed out but not evaluated: the end of length, or of a stop string.
        self.pending = token if reason == "length" or output.stopped else None
        return reason

    def _prefill_paced(self, tokens: Sequence[int], pace: Pace, stop: threading.Event) -> bool:
        """Evaluate what is not resident of `tokens` but the last, one batch
        at a time, choosing the thread count before each: a long prompt
        gets the threads a stream ending meanwhile gives back (the layout
        decides per batch, not once for the whole prompt), and a cancel
        stops it within a batch. llama-cpp-python's generator then
        evaluates only the last token. False when cancelled."""
        llama = self._llama
        keep = common_prefix(self.resident(), tokens[:-1])
        rest = list(tokens[keep:-1])
        if len(rest) <= llama.n_batch:
            return True  # one batch: the generator's own eval is the same
        llama.n_tokens = keep  # eval drops the KV cells after it
        for start in range(0, len(rest), llama.n_batch):
            if stop.is_set():
                return False
            with pace.turn():
                self.use_threads(pace.threads(self.max_threads))
                llama.eval(rest[start:start + llama.n_batch])
        return True

    def _last_logits(self) -> Any:
        """The raw logits row the token just yielded was sampled from: the
        generator evaluates it only when asked for the next one, and the
        logits processors rewrite llama.cpp's copy of the row, not this."""
        from syntrop.runtimed.worker.batch import logits

        return logits(self._llama._ctx.ctx, -1, int(self._llama.n_vocab()))

    def _sample(self, tokens: Sequence[int], params: Params, logits_processor: Any) -> Any:
        """llama-cpp-python's generator of sampled tokens after `tokens`."""
        return self._llama.generate(list(tokens), top_k=params.top_k, top_p=params.top_p,
                                    min_p=params.min_p, temp=params.temperature,
                                    repeat_penalty=1.0, reset=True,
                                    logits_processor=logits_processor)

    def can_shift(self) -> bool:
        """Whether this context's KV cache can move positions (sinks.py)."""
        import llama_cpp

        return bool(llama_cpp.llama_memory_can_shift(
            llama_cpp.llama_get_memory(self._llama._ctx.ctx)))

    def shift(self, window: "Window", incoming: int) -> int:
        """Make room for `incoming` tokens after the resident ones by dropping
        tokens after the window's sinks (sinks.py); tokens dropped."""
        llama = self._llama
        resident = self.resident()
        dropped = window.slide(llama._ctx.ctx, resident, incoming, self.n_ctx)
        if dropped:
            kept = resident[:window.sinks] + resident[window.sinks + dropped:]
            llama.input_ids[:len(kept)] = kept
            llama.n_tokens = len(kept)
        return dropped

    def speculate(self, tokens: Sequence[int], params: Params, stop: threading.Event,
                  emit: Emit, *, drafter: Any, draft_max: int,
                  extra_stops: tuple[str, ...] = (), pace: Pace | None = None,
                  first: Callable[[], None] | None = None) -> tuple[str, int, int]:
        """Generate after `tokens` speculatively (speculative.py): `drafter`
        proposes up to `draft_max` tokens a step and this model verifies them
        in one batch. The finish reason, tokens drafted and accepted."""
        from syntrop.runtimed.worker.speculative import Sampler, Speculator

        pace = pace or Pace("threads", self.max_threads)
        self.check_fits(len(tokens))
        budget = min(params.max_tokens, self.n_ctx - len(tokens))
        output = Output(self._llama, emit, params.stop + extra_stops)
        sampler = Sampler(temperature=params.temperature, top_k=params.top_k,
                          top_p=params.top_p, min_p=params.min_p, seed=params.seed)

        def on_tokens(step: list[int]) -> bool:
            if first is not None and output.count == 0:
                first()
            return all(output.token(token) for token in step)

        self.pending = None
        speculator = Speculator(self._llama, drafter, draft_max=draft_max)
        try:
            # Counted as running, threads set once; it takes no turns (the
            # `threads` layout's gate), which would hold every other stream
            # for the whole generation.
            with pace.running():
                self.use_threads(pace.threads(self.max_threads))
                result = speculator.generate(tokens, budget, sampler=sampler,
                                             on_tokens=on_tokens, stop=stop)
        finally:
            speculator.close()
        output.close()
        self.pending = result.pending
        return result.reason, result.drafted, result.accepted

    def attach_lora(self, fd: int, scale: float) -> None:
        """Check the LoRA adapter behind `fd` against this model and apply
        it to this context with `scale` (lora.AdapterError when it does not
        fit). The weights are freed with the model."""
        from pathlib import Path

        from syntrop.runtimed.worker.lora import Adapter

        Adapter.load(self._llama, Path(f"/proc/self/fd/{fd}")).attach(self._llama, scale)

    def guide(self, constraint: "Constraint") -> Any:
        """A logits processor list that keeps generation inside `constraint`
        (llguidance's token mask; the vocabulary is read once per model)."""
        from llama_cpp import LogitsProcessorList

        from syntrop.runtimed.constrain import Guide, tokenizer_for

        return LogitsProcessorList([Guide(constraint, tokenizer_for(self._llama))])

    def embed(self, texts: Sequence[str], pace: Pace | None = None) -> list[list[float]]:
        """L2-normalised embeddings, one per text."""
        pace = pace or Pace("threads", self.max_threads)
        with pace.running(), pace.turn():
            self.use_threads(pace.threads(self.max_threads))
            vectors = self._llama.embed(list(texts), normalize=True)
        return [[float(x) for x in v] for v in vectors]

    @property
    def n_embd(self) -> int:
        return int(self._llama.n_embd())

    def close(self) -> None:
        if self.weights is None:
            self._llama.close()
        else:  # the model stays, for the other contexts on it
            self._llama._ctx.close()
            self._llama._batch.close()


class Weights:
    """A model loaded once for the contexts of one `Options`, shared by all
    of them: llama.cpp runs several contexts over one llama_model, so a
    pool's slots hold one copy of the weights and each context only its own
    KV cache, batch and token buffers. The first context is loaded whole
    (its `Llama` owns the model); later ones are that `Llama`'s settings
    over a context of their own on its model (`_share`). `close` frees the
    model, and with it every context still on it."""

    def __init__(self, fd: int, options: Options, placed: Placed | None = None) -> None:
        self.fd = fd
        self.options = options
        self.placed = placed
        self._owner: Any = None
        self._lock = threading.Lock()

    def context(self) -> Engine:
        """A new context on these weights (LoadError when they do not load)."""
        from syntrop.runtimed.cpu import plane_threads

        with self._lock:
            if self._owner is None:
                engine = Engine.load(self.fd, self.options, placed=self.placed)
                self._owner = engine.llama
            else:
                free = 0 if self.options.n_threads else plane_threads()
                kwargs = llama_kwargs(self.fd, self.options, self.placed or Placed(), free=free)
                threads = int(kwargs["n_threads"])
                engine = Engine(_share(self._owner, threads), threads)
        engine.weights = self
        return engine

    def close(self) -> None:
        with self._lock:
            owner, self._owner = self._owner, None
        if owner is not None:
            owner.close()


def _share(owner: Any, threads: int) -> Any:
    """A `Llama` over `owner`'s model with a context of its own: `owner`'s
    settings (the same context parameters but its thread count) and fresh
    per-context state, as `Llama.__init__` makes it. Closing it frees its
    context and batch, never the model."""
    import contextlib
    import ctypes

    import numpy as np
    from llama_cpp import Llama, llama_cpp
    from llama_cpp import _internals as internals

    llama = Llama.__new__(type(owner))
    llama.__dict__.update(owner.__dict__)
    params = llama_cpp.llama_context_params.from_buffer_copy(owner.context_params)
    params.n_threads = params.n_threads_batch = threads
    llama.context_params = params
    llama.n_threads = llama.n_threads_batch = threads
    llama._stack = contextlib.ExitStack()
    try:
        llama._ctx = llama._stack.enter_context(contextlib.closing(
            internals.LlamaContext(model=owner._model, params=params, verbose=False)))
        llama._batch = llama._stack.enter_context(contextlib.closing(
            internals.LlamaBatch(n_tokens=llama.n_batch, embd=0, n_seq_max=params.n_ctx,
                                 verbose=False)))
    except ValueError as error:  # llama.cpp could not make the context
        llama._stack.close()
        raise LoadError(str(error)) from None
    llama._lora_adapter = None
    llama._candidates = internals.LlamaTokenDataArray(n_vocab=llama._n_vocab)
    llama._sampler = None
    llama.cache = None
    llama.n_tokens = 0
    llama._requires_eval = True
    llama.input_ids = np.ndarray(owner.input_ids.shape, dtype=np.intc)
    llama.scores = np.ndarray(owner.scores.shape, dtype=np.single)
    llama._mirostat_mu = ctypes.c_float(2.0 * 5.0)
    return llama
