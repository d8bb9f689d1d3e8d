"""`syn run MODEL [PROMPT]`, `syn ps` and `syn unload`: runtimed from the
terminal.

`syn run` streams the answer as it comes: one-shot when a prompt is given,
otherwise a chat that keeps the conversation until /bye or end of input.
`syn ps` shows what runtimed holds (GetLoad): models, slots, keep-alive left.
`syn unload [MODEL]` unloads idle models now (Unload).
"""

import argparse
import asyncio
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from syntrop.interfaces.clients import Runtime1Client
    from syntrop.interfaces.runtime import ChatMessage, Sampling

#: Seconds a stream may go without a reply (a model load included).
STREAM_TIMEOUT = 300.0
#: Lines that end an interactive chat.
BYE = ("/bye", "/exit")


class RunError(Exception):
    """A failure to report in one line."""


async def _connect() -> "Runtime1Client":
    from syntrop.interfaces.runtime import Runtime1
    from syntrop.varlink.client import address_of, connect

    try:
        return await connect(Runtime1, timeout=STREAM_TIMEOUT)
    except OSError as error:
        raise RunError(f"cannot reach runtimed at {address_of(Runtime1)}: "
                       f"{error.strerror or error}") from None


def _guard(coroutine: Any) -> int:
    from asyncvarlink import VarlinkErrorReply

    try:
        return int(asyncio.run(coroutine))
    except VarlinkErrorReply as error:
        from syntrop.interfaces.runtime import in_words

        parameters = error.paramstojson()
        words = in_words(error.name, parameters)
        if words is not None:
            raise RunError(words) from None
        name = error.name.rsplit(".", 1)[-1]
        raise RunError(f"runtimed answered {name} {json.dumps(parameters)}") from None
    except (ConnectionError, EOFError):
        raise RunError("lost the connection to runtimed") from None


async def _answer(client: "Runtime1Client", model: str, messages: "list[ChatMessage]",
                  sampling: "Sampling") -> str:
    text = ""
    async for reply in client.Chat(model=model, messages=messages, sampling=sampling):
        chunk = reply["chunk"]
        text += chunk.text
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return text


async def _run(args: argparse.Namespace) -> int:
    from syntrop.interfaces.runtime import ChatMessage, Sampling

    sampling = Sampling(max_tokens=args.max_tokens, temperature=args.temperature, top_p=None,
                        top_k=None, seed=args.seed, stop=None)
    messages: list[ChatMessage] = []
    async with await _connect() as client:
        if args.prompt:
            messages.append(ChatMessage(role="user", content=" ".join(args.prompt)))
            await _answer(client, args.model, messages, sampling)
            return 0
        while True:
            try:
                line = await asyncio.to_thread(input, ">>> ")
            except EOFError:
                return 0
            if not line.strip():
                continue
            if line.strip() in BYE:
                return 0
            messages.append(ChatMessage(role="user", content=line))
            text = await _answer(client, args.model, messages, sampling)
            messages.append(ChatMessage(role="assistant", content=text))


async def _ps(args: argparse.Namespace) -> int:
    async with await _connect() as client:
        load = await client.GetLoad()
    if args.json:
        print(json.dumps(load, indent=2, default=dataclasses.asdict))
        return 0
    print(f"slots: {load['total_slots'] - load['free_slots']} of {load['total_slots']} in use, "
          f"{load['queue_depth']} waiting")
    print(f"resident: {load['resident_bytes'] / 2**20:.1f} MiB"
          + (f", {load['spilled_sessions']} sessions spilled" if load["spilled_sessions"]
             else ""))
    models = load["models"]
    if models is None:  # an older runtimed: names only
        for name in load["loaded_models"]:
            print(f"  {name}")
        return 0
    if models:
        print(f"  {'MODEL':24} {'SIZE':>10} {'BUSY':>4} {'SESSIONS':>8}  KEEP-ALIVE")
    for model in models:
        left = model.keep_alive_s
        until = "in use" if left is None else f"{left:.0f} s"
        print(f"  {model.name:24} {model.resident_bytes / 2**20:7.1f} MiB {model.busy:4} "
              f"{model.sessions:8}  {until}")
    return 0


async def _unload(args: argparse.Namespace) -> int:
    async with await _connect() as client:
        result = await client.Unload(model=args.model)
    for name in result["unloaded"]:
        print(f"unloaded {name}")
    for name in result["in_use"]:
        print(f"kept {name}: in use", file=sys.stderr)
    if args.model is not None and not result["unloaded"] and not result["in_use"]:
        print(f"{args.model} is not loaded", file=sys.stderr)
    return 1 if result["in_use"] else 0


def cmd_run(args: argparse.Namespace) -> int:
    return _guard(_run(args))


def cmd_ps(args: argparse.Namespace) -> int:
    return _guard(_ps(args))


def cmd_unload(args: argparse.Namespace) -> int:
    return _guard(_unload(args))


def _reported(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except RunError as error:
            print(f"syn: {error}", file=sys.stderr)
            return 1

    return run


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add `run`, `ps` and `unload` to syn's subcommands."""
    run = commands.add_parser("run", help="chat with a model (one-shot with a prompt)")
    run.add_argument("model", metavar="MODEL")
    run.add_argument("prompt", nargs="*", metavar="PROMPT")
    run.add_argument("--max-tokens", type=int, default=None)
    run.add_argument("--temperature", type=float, default=None)
    run.add_argument("--seed", type=int, default=None)
    run.set_defaults(func=_reported(cmd_run))
    ps = commands.add_parser("ps", help="loaded models and slots in runtimed")
    ps.add_argument("--json", action="store_true", help="machine-readable output")
    ps.set_defaults(func=_reported(cmd_ps))
    unload = commands.add_parser("unload", help="unload idle models from runtimed now")
    unload.add_argument("model", nargs="?", metavar="MODEL", help="one model (default: all idle)")
    unload.set_defaults(func=_reported(cmd_unload))
