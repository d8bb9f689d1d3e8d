"""The engine wheel in the venv works as llama-cpp-python's users expect: a
bare `import llama_cpp` (nothing of syntrop's run first) loads a CPU backend,
the one runtimed would choose here, and a model answers."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.models import require_llama, smollm2

require_llama()

SCRIPT = """
import json, os, sys
import llama_cpp

model = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, verbose=False)
text = model.create_completion("The capital of France is", max_tokens=4,
                               temperature=0)["choices"][0]["text"]
with open("/proc/self/maps") as maps:
    loaded = sorted({os.path.basename(line.split()[-1]) for line in maps
                     if "libggml-cpu-" in line})
print(json.dumps({"text": text, "loaded": loaded}))
"""


def test_a_bare_import_loads_the_chosen_cpu_backend_and_a_model(tmp_path: Path) -> None:
    from syntrop.runtimed.cpu import probe

    chosen = probe()
    env = {k: v for k, v in os.environ.items() if k != "SYNTROP_CPU_BACKEND"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(smollm2())], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["text"].strip()
    assert answer["loaded"] == [f"libggml-cpu-{chosen.variant}.so"]
