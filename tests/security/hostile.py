"""Running a parser on attacker bytes: in a child process with its address
space capped, so a parse that allocates without bound dies there (and the
test fails) instead of taking the run down, and every answer is timed."""

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: The address space a child parsing attacker bytes may map.
MEMORY_CAP = 2 << 30
#: How long an answer may take.
ANSWER_S = 2.0

_PRELUDE = f"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP}))
"""


@dataclass(frozen=True, slots=True)
class Outcome:
    #: "ok", or the name of the exception the parse raised.
    result: str
    detail: str
    seconds: float


def run_capped(body: str, args: Sequence[str | Path], timeout: float = 30.0,
               ) -> dict[str, Outcome]:
    """Run `body` (Python defining `parse(arg) -> str`) over each argument
    (a path, a template) in one capped child; the outcome of each, by
    argument. A child killed by a
    signal or the timeout fails the calling test."""
    script = _PRELUDE + body + """
for path in sys.argv[1:]:
    start = time.monotonic()
    try:
        result, detail = "ok", parse(path)
    except Exception as error:
        result, detail = type(error).__name__, str(error)[:300]
    print(json.dumps([path, result, detail, time.monotonic() - start]), flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"the parser died ({done.returncode}): {done.stderr[-2000:]}"
    outcomes = {}
    for line in done.stdout.splitlines():
        if line.startswith("["):
            path, result, detail, seconds = json.loads(line)
            outcomes[path] = Outcome(result, detail, seconds)
    return outcomes


def timed(seconds: float) -> bool:
    return seconds < ANSWER_S

