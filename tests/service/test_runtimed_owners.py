"""A Runtime1 session belongs to the uid that opened it: to any other
(unprivileged) uid it does not exist. Real modeld and runtimed,
socket-activated, SmolLM2; the other uid is nobody (65534), in a child
process that drops root before it connects."""

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import varlink

from tests.models import model_node, require_llama
from tests.support import Activated, require_nobody_can_run_us

require_llama()

RUNTIME = "io.syntrop.Runtime1"
MANIFEST = {"profile": "p", "model": "smollm2", "model_digest": "m", "tokenizer_digest": "t",
            "template_digest": "x", "runtime_digest": "r", "bos": "add"}
SECRET = "The launch code is 7 4 1 9. " * 8

#: Each method a session id opens, as nobody calls it; what it answered.
AS_NOBODY = """
import json, os, sys, varlink
os.setgid(65534); os.setuid(65534)
address, sid, manifest = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
calls = {
    "Decode": lambda p: list(p.Decode(session_id=sid, sampling={"max_tokens": 8},
                                      _more=True)),
    "PrefillSuffix": lambda p: p.PrefillSuffix(session_id=sid, text=" and more",
                                               manifest=manifest),
    "EnsurePrefix": lambda p: p.EnsurePrefix(session_id=sid, text="mine now",
                                             manifest=manifest),
    "ExplainContext": lambda p: p.ExplainContext(session_id=sid),
    "Close": lambda p: p.Close(session_id=sid),
}
answers = {}
for name, call in calls.items():
    with varlink.Client(address=address) as client, client.open("io.syntrop.Runtime1") as p:
        try:
            answers[name] = ["reply", call(p)]
        except varlink.VarlinkError as error:
            answers[name] = [error.error(), error.parameters()]
print(json.dumps(answers))
"""


@pytest.fixture
def shared_node() -> Iterator[Activated]:
    """modeld and runtimed in a directory nobody can reach too (pytest's
    tmp_path is private to root), runtimed's socket open to everyone."""
    require_nobody_can_run_us()
    root = Path(tempfile.mkdtemp(prefix="syntrop-owners-"))
    try:
        root.chmod(0o755)
        with ExitStack() as stack:
            runtimed = stack.enter_context(model_node(root, stack))
            for directory in (root / "run", Path(runtimed.address.removeprefix("unix:")).parent):
                directory.chmod(0o755)
            Path(runtimed.address.removeprefix("unix:")).chmod(0o666)
            yield runtimed
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_another_uid_finds_no_session_and_the_owners_is_intact(
        shared_node: Activated) -> None:
    with varlink.Client(address=shared_node.address) as client, \
            client.open(RUNTIME) as runtime:
        sid = runtime.OpenSession(owner_instance_id="root-1", model="smollm2",
                                  config=None)["session_id"]
        prefix = runtime.EnsurePrefix(session_id=sid, text=SECRET, manifest=MANIFEST)
        before = runtime.ExplainContext(session_id=sid)

        out = subprocess.run([sys.executable, "-c", AS_NOBODY, shared_node.address, sid,
                              json.dumps(MANIFEST)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        answers: dict[str, list[Any]] = json.loads(out.stdout)
        assert set(answers) == {"Decode", "PrefillSuffix", "EnsurePrefix", "ExplainContext",
                                "Close"}
        for name, (error, parameters) in answers.items():
            assert error == f"{RUNTIME}.SessionNotFound", (name, error, parameters)
            assert parameters == {"session_id": sid}, (name, parameters)

        # Nothing of it moved: the same prefix, still open, and it decodes.
        after = runtime.ExplainContext(session_id=sid)
        assert after == before and not after["closed"]
        assert after["prefix_tokens"] == prefix["prefix_tokens"]
        runtime.PrefillSuffix(session_id=sid, text=" Repeat it:", manifest=MANIFEST)
        replies = list(runtime.Decode(session_id=sid, sampling={"max_tokens": 4,
                                                                "temperature": 0},
                                      _more=True))
        assert replies
        runtime.Close(session_id=sid)


#: The prefill hand-off's two calls, as nobody makes them: what each answered.
HANDOFF_AS_NOBODY = """
import asyncio, json, os, sys
from syntrop.interfaces.runtime import ChatMessage, Runtime1
from syntrop.varlink import FileDescriptor
from syntrop.varlink.client import connect
os.setgid(65534); os.setuid(65534)  # after the imports: root's interpreter

async def main():
    messages = [ChatMessage(role="user", content="Hi")]
    answers = {}
    state = os.memfd_create("state")
    os.write(state, b"0" * 64)
    calls = {
        "Prefill": lambda r: r.Prefill(model="smollm2", messages=messages),
        "Chat": lambda r: r.Chat(model="smollm2", messages=messages,
                                 prefix_state=FileDescriptor(state)).__anext__(),
    }
    for name, call in calls.items():
        async with await connect(Runtime1, address=sys.argv[1], timeout=60) as runtime:
            try:
                await call(runtime)
                answers[name] = "reply"
            except Exception as error:
                answers[name] = type(error).__name__
    print(json.dumps(answers))

asyncio.run(main())
"""


def test_only_runtimeds_own_user_hands_off_a_prefill(shared_node: Activated) -> None:
    """Runtime1.Prefill and Chat's prefix_state (restored KV is used as
    computed) refuse an unprivileged uid: NotAuthorized, before any work."""
    out = subprocess.run([sys.executable, "-c", HANDOFF_AS_NOBODY, shared_node.address],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"Prefill": "NotAuthorized", "Chat": "NotAuthorized"}
