"""A conformance suite for OpenAI- (and Anthropic-) compatible servers,
driven by the official openai and anthropic clients against a base URL.

Each check exercises ONE feature and never raises: an exception is a fail
with its message. A feature a server does not offer fails (it is never
skipped), so a table of results shows it.

    python -m tests.conformance --base-url http://127.0.0.1:PORT/v1 --model NAME

tests/service/test_conformance.py runs it against routerd in `make test`;
bench/conformance_compare.py against routerd and llama-cpp-python's own
server side by side (docs/routerd.md, "Conformance").
"""

from tests.conformance.checks import (
    ASK,
    CHECKS,
    CITY,
    GREEDY,
    SCHEMAS,
    TOOLS,
    Check,
    Clients,
    Result,
    clients,
    run,
    run_all,
)

__all__ = ["ASK", "CHECKS", "CITY", "GREEDY", "SCHEMAS", "TOOLS", "Check",
           "Clients", "Result", "clients", "run", "run_all"]
