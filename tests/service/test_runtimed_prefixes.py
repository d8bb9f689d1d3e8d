"""runtimed keeps the KV of the chats it served in its idle contexts and
gives a chat the context that holds its start (runtimed/worker/pool.py), and says
which chat prefixes are resident (Runtime1.GetLoad), as the digests routerd
computes: real runtimed and modeld, socket-activated, SmolLM2."""

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import varlink

from syntrop.prefix import reported
from tests.models import model_node, require_llama
from tests.support import Activated

require_llama()

RUNTIME = "io.syntrop.Runtime1"


def system(topic: str) -> str:
    """A system prompt of about 500 tokens."""
    return " ".join(f"Rule {i}: answer about {topic}, briefly and politely." for i in range(50))


def chat(runtimed: Activated, turns: list[tuple[str, str]]) -> float:
    """Seconds to the end of a one-token answer."""
    started = time.monotonic()
    with varlink.Client(address=runtimed.address) as client, client.open(RUNTIME) as proxy:
        list(proxy.Chat(model="smollm2", messages=[{"role": r, "content": c} for r, c in turns],
                        sampling={"max_tokens": 1, "temperature": 0}, _more=True))
    return time.monotonic() - started


def cache(runtimed: Activated) -> dict[str, Any]:
    with varlink.Client(address=runtimed.address) as client, client.open(RUNTIME) as proxy:
        (model,) = proxy.GetLoad()["models"]
    return dict(model)


@pytest.fixture
def runtimed(tmp_path: Path) -> Iterator[Activated]:
    with ExitStack() as stack:
        yield stack.enter_context(model_node(tmp_path, stack))


def test_chats_find_their_prefix_resident_and_runtimed_says_which(
        runtimed: Activated) -> None:
    a = [("system", system("rivers")), ("user", "Which is longest?")]
    b = [("system", system("mountains")), ("user", "Which is highest?")]
    chat(runtimed, a)  # loads the model too
    assert cache(runtimed)["prefixes"] == sorted(reported(a))
    cold = chat(runtimed, b)  # a new prefix: a context of its own, a's kept
    model = cache(runtimed)
    assert model["prefixes"] == sorted(reported(a) + reported(b))
    assert model["cached_contexts"] == 2
    again = [a[0], ("user", "Which is widest?")]
    warm = chat(runtimed, again)
    assert cache(runtimed)["prefixes"] == sorted(reported(again) + reported(b))
    # ~500 tokens of prefill against one: an order of magnitude at least.
    assert warm * 5 < cold, (warm, cold)


def pieces(runtimed: Activated, turns: list[tuple[str, str]], max_tokens: int,
           **extra: Any) -> list[str]:
    """The text of each reply of a greedy chat."""
    with varlink.Client(address=runtimed.address) as client, client.open(RUNTIME) as proxy:
        replies = list(proxy.Chat(
            model="smollm2", messages=[{"role": r, "content": c} for r, c in turns],
            sampling={"max_tokens": max_tokens, "temperature": 0}, _more=True, **extra))
    return [r["chunk"]["text"] for r in replies if r["chunk"]["text"]]


def test_a_chat_continues_an_answer_begun_where_it_stopped(runtimed: Activated) -> None:
    """What a stream resumed on another node asks (routerd's continuation):
    the answer so far as an open assistant turn, and the model goes on with
    it; greedy, that is the rest of the answer it would have given."""
    ask = [("user", "Count from one to twenty in words, separated by commas.")]
    whole = pieces(runtimed, ask, 24)
    begun = "".join(whole[:8])
    rest = "".join(pieces(runtimed, [*ask, ("assistant", begun)], 16, continue_last=True))
    assert begun + rest == "".join(whole), (begun, rest, whole)
    # Without it, the answer begun is a closed turn: the model answers anew.
    anew = "".join(pieces(runtimed, [*ask, ("assistant", begun)], 16))
    assert begun + anew != "".join(whole)
    with pytest.raises(varlink.VarlinkError) as caught:
        pieces(runtimed, ask, 4, continue_last=True)  # nothing begun to continue
    assert caught.value.error() == "org.varlink.service.InvalidParameter"
    assert caught.value.parameters() == {"parameter": "continue_last"}


def test_a_sessions_declared_prompt_format_is_checked_against_the_model(
        runtimed: Activated) -> None:
    """SmolLM2's template is ChatML: a session that says it writes ChatML
    opens, one that says Gemma does not, nor one that names no known format."""
    def open_session(prompt_format: str | None) -> Any:
        config = {"n_ctx": None, "n_batch": None, "n_threads": None, "n_gpu_layers": None,
                  "flash_attn": None, "kv_cache_type": None, "prompt_format": prompt_format,
                  "disable_bos": None}
        with varlink.Client(address=runtimed.address) as client, \
                client.open(RUNTIME) as proxy:
            opened = proxy.OpenSession(owner_instance_id=f"fmt-{prompt_format}",
                                       model="smollm2", config=config)
            proxy.Close(session_id=opened["session_id"])
            return opened

    assert open_session("chatml")["session_id"]
    assert open_session("raw")["session_id"]
    for wrong in ("gemma", "klingon"):
        with pytest.raises(varlink.VarlinkError) as caught:
            open_session(wrong)
        assert caught.value.parameters() == {"parameter": "config.prompt_format"}, wrong
    # A refused session holds nothing: every slot is free.
    with varlink.Client(address=runtimed.address) as client, client.open(RUNTIME) as proxy:
        load = proxy.GetLoad()
    assert load["free_slots"] == load["total_slots"]
