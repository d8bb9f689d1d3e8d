"""python -m tests.conformance --base-url URL --model NAME [--json] [--only FEATURE]

Runs every feature check against the server at URL (an OpenAI base URL,
with or without its /v1) and prints a table; exit status 0 only when every
check passed."""

import argparse
import json
import sys
from dataclasses import asdict

from tests.conformance.checks import CHECKS, Result, clients


def table(results: list[Result]) -> str:
    width = max(len(r.feature) for r in results)
    lines = [f"{'feature':<{width}}  result  {'latency ms':>10}  reason"]
    for r in results:
        lines.append(f"{r.feature:<{width}}  {'pass' if r.ok else 'FAIL':<6}  "
                     f"{r.latency_ms:>10.0f}  {r.reason}")
    passed = sum(r.ok for r in results)
    lines.append(f"{passed} of {len(results)} passed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True,
                        help="e.g. http://127.0.0.1:8080/v1 (the /v1 may be left out)")
    parser.add_argument("--model", default="smollm2", help="the model name to ask for")
    parser.add_argument("--json", action="store_true", help="one JSON object per feature")
    parser.add_argument("--only", action="append", default=[], metavar="FEATURE",
                        help="run only this feature (repeatable)")
    parser.add_argument("--timeout", type=float, default=120, help="per request, seconds")
    options = parser.parse_args(argv)
    names = {c.name for c in CHECKS}
    unknown = [name for name in options.only if name not in names]
    if unknown:
        parser.error(f"unknown feature(s) {unknown}; known: {sorted(names)}")
    on = clients(options.base_url, options.timeout)
    results = []
    for chosen in CHECKS:
        if options.only and chosen.name not in options.only:
            continue
        result = chosen(on.openai, on.anthropic, options.model)
        results.append(result)
        if options.json:
            print(json.dumps(asdict(result)), flush=True)
    if not options.json:
        print(table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
