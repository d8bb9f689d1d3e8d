"""`syn say [--voice V] [--model joe] [--speed S] [--out FILE] TEXT`: a voice
model's speech (Runtime1.Speak) from the terminal.

Played as it comes through pw-cat where a PipeWire server is reachable (its
socket exists and pw-cat is installed); otherwise, or when pw-cat fails
(exits non-zero: no server after all), written to a WAV file it names
(--out, default ./say.wav)."""

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import wave
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

#: runtimed's speech: mono signed 16-bit little-endian PCM at this rate.
RATE = 24_000
#: Where the speech goes when it is not played.
DEFAULT_OUT = Path("say.wav")


def player(environ: Mapping[str, str] = os.environ,
           exists: Callable[[str], bool] = os.path.exists,
           which: Callable[[str], str | None] = shutil.which) -> list[str] | None:
    """pw-cat's command line to play the speech, or None where no PipeWire
    server is reachable: pw-cat missing, or no socket ($PIPEWIRE_REMOTE, a
    path or a name in $XDG_RUNTIME_DIR, default pipewire-0)."""
    program = which("pw-cat")
    if program is None:
        return None
    remote = environ.get("PIPEWIRE_REMOTE") or "pipewire-0"
    if not os.path.isabs(remote):
        runtime = environ.get("XDG_RUNTIME_DIR")
        if not runtime:
            return None
        remote = os.path.join(runtime, remote)
    if not exists(remote):
        return None
    return [program, "--playback", "--rate", str(RATE), "--format", "s16", "--channels", "1",
            "-"]


def write_wav(path: Path, pcm: bytes) -> None:
    """`pcm` (mono S16LE at RATE) as a WAV file at `path`."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm)


class SayError(Exception):
    """A failure to report in one line."""


async def speak(model: str, text: str, voice: str | None, speed: float | None,
                sink: IO[bytes] | None) -> bytes:
    """The speech's PCM, each packet also written to `sink` as it comes
    (until the sink fails: the player went away)."""
    import base64

    from asyncvarlink import VarlinkErrorReply

    from syntrop.interfaces.runtime import Runtime1, in_words
    from syntrop.varlink.client import address_of, connect

    try:
        client = await connect(Runtime1, timeout=300)
    except OSError as error:
        raise SayError(f"cannot reach runtimed at {address_of(Runtime1)}: "
                       f"{error.strerror or error}") from None
    pcm = bytearray()
    async with client:
        try:
            async for reply in client.Speak(model=model, text=text, voice=voice, speed=speed):
                packet = reply["packet"] if isinstance(reply, dict) else reply
                data = base64.b64decode(packet.audio)
                pcm += data
                if sink is not None and data:
                    try:
                        sink.write(data)
                        sink.flush()
                    except OSError:  # the player exited: the file gets it all
                        sink = None
        except VarlinkErrorReply as error:
            words = in_words(error.name, error.paramstojson())
            raise SayError(words or f"runtimed answered {error.name.rsplit('.', 1)[-1]} "
                                    f"{error.paramstojson()}") from None
    return bytes(pcm)


def cmd_say(args: argparse.Namespace) -> int:
    text = " ".join(args.text)
    command = player()
    process = None if command is None else subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pcm = asyncio.run(speak(args.model, text, args.voice, args.speed,
                                None if process is None else process.stdin))
    except SayError as error:
        print(f"syn: {error}", file=sys.stderr)
        return 1
    finally:
        if process is not None:
            _close(process)
    seconds = len(pcm) / 2 / RATE
    if process is not None and process.returncode == 0:
        print(f"played {seconds:.1f} s of speech")
        return 0
    write_wav(args.out, pcm)
    print(f"wrote {seconds:.1f} s of speech to {args.out}"
          + ("" if process is None else f" (pw-cat exited {process.returncode})"))
    return 0


def _close(process: "subprocess.Popen[bytes]") -> None:
    """Let pw-cat play what it was given, then reap it."""
    assert process.stdin is not None
    with contextlib.suppress(OSError):  # it went away: nothing to flush
        process.stdin.close()
    process.wait()


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add `say` to syn's subcommands."""
    say = commands.add_parser("say", help="speak a text with a voice model")
    say.add_argument("text", nargs="+", metavar="TEXT")
    say.add_argument("--model", default="joe", help="the voice model (default joe)")
    say.add_argument("--voice", default=None, help="a speaker of it (default its first)")
    say.add_argument("--speed", type=float, default=None, help="0.5 to 2.0 (default 1)")
    say.add_argument("--out", type=Path, default=DEFAULT_OUT,
                     help="the WAV file written where nothing plays it (default ./say.wav)")
    say.set_defaults(func=cmd_say)
