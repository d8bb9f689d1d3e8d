"""`syn say` (no runtimed): the WAV it writes, whether it plays through
pw-cat, and the file it falls back to when pw-cat fails."""

import argparse
import os
import stat
import wave
from pathlib import Path
from typing import IO, Any

import pytest

from syntrop.cli import say


def test_the_wav_file_holds_the_samples_mono_s16_24khz(tmp_path: Path) -> None:
    pcm = bytes(range(256)) * 10
    say.write_wav(tmp_path / "out.wav", pcm)
    with wave.open(str(tmp_path / "out.wav")) as read:
        assert (read.getnchannels(), read.getsampwidth(), read.getframerate()) == (1, 2, 24_000)
        assert read.getnframes() == len(pcm) // 2
        assert read.readframes(read.getnframes()) == pcm
    assert (tmp_path / "out.wav").stat().st_size == 44 + len(pcm)


def _which(name: str) -> str | None:
    return f"/usr/bin/{name}"


def test_pw_cat_plays_where_a_pipewire_socket_is() -> None:
    sockets = {"/run/user/1000/pipewire-0", "/tmp/pw/remote", "/run/user/1000/other"}
    command = say.player({"XDG_RUNTIME_DIR": "/run/user/1000"}, sockets.__contains__, _which)
    assert command == ["/usr/bin/pw-cat", "--playback", "--rate", "24000", "--format", "s16",
                       "--channels", "1", "-"]
    assert say.player({"PIPEWIRE_REMOTE": "/tmp/pw/remote"}, sockets.__contains__, _which)
    assert say.player({"PIPEWIRE_REMOTE": "other", "XDG_RUNTIME_DIR": "/run/user/1000"},
                      sockets.__contains__, _which)


def test_no_player_without_a_socket_or_pw_cat() -> None:
    sockets = {"/run/user/1000/pipewire-0"}
    assert say.player({}, sockets.__contains__, _which) is None  # no XDG_RUNTIME_DIR
    assert say.player({"XDG_RUNTIME_DIR": "/run/user/2000"}, sockets.__contains__,
                      _which) is None
    assert say.player({"PIPEWIRE_REMOTE": "/tmp/none"}, sockets.__contains__, _which) is None
    assert say.player({"XDG_RUNTIME_DIR": "/run/user/1000"}, sockets.__contains__,
                      lambda name: None) is None


def _fake_speech(monkeypatch: pytest.MonkeyPatch, pcm: bytes) -> None:
    async def speak(model: str, text: str, voice: str | None, speed: float | None,
                    sink: IO[bytes] | None) -> bytes:
        if sink is not None:
            try:
                for start in range(0, len(pcm), 960):
                    sink.write(pcm[start:start + 960])
                    sink.flush()
            except OSError:
                pass
        return pcm

    monkeypatch.setattr(say, "speak", speak)


def _args(out: Path) -> argparse.Namespace:
    return argparse.Namespace(text=["Hello."], model="joe", voice=None, speed=None, out=out)


def _pw_cat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """A pw-cat on PATH running `script`, and a PipeWire socket to find."""
    tool = tmp_path / "bin" / "pw-cat"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "pipewire-0").touch()
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("PIPEWIRE_REMOTE", raising=False)


def test_a_failing_pw_cat_leaves_the_speech_in_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    pcm = b"\x01\x00" * 48_000
    _fake_speech(monkeypatch, pcm)
    _pw_cat(tmp_path, monkeypatch, "exit 1\n")
    assert say.cmd_say(_args(tmp_path / "say.wav")) == 0
    with wave.open(str(tmp_path / "say.wav")) as read:
        assert read.readframes(read.getnframes()) == pcm
    assert "wrote 2.0 s of speech to" in capsys.readouterr().out


def test_a_working_pw_cat_gets_every_sample_and_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    pcm = b"\x02\x00" * 24_000
    _fake_speech(monkeypatch, pcm)
    _pw_cat(tmp_path, monkeypatch, f"cat > {tmp_path / 'played.raw'}\n")
    assert say.cmd_say(_args(tmp_path / "say.wav")) == 0
    assert (tmp_path / "played.raw").read_bytes() == pcm
    assert not (tmp_path / "say.wav").exists()
    assert "played 1.0 s of speech" in capsys.readouterr().out


def test_without_pipewire_the_file_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_speech(monkeypatch, b"\x03\x00" * 100)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no socket in it
    monkeypatch.delenv("PIPEWIRE_REMOTE", raising=False)
    assert say.cmd_say(_args(tmp_path / "out.wav")) == 0
    assert (tmp_path / "out.wav").stat().st_size == 44 + 200
