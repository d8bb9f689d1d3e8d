"""Journal slices with a fake journalctl: what is asked, what is kept."""

from collections.abc import Callable, Sequence
from typing import Any

from syntrop.contextd.journal import (
    FAILURE_MESSAGE_ID,
    at,
    is_invocation_id,
    kernel_argv,
    line_of,
    slice_unit,
    text,
)
from syntrop.system.journal import Result, Source

S = 1_000_000
INVOCATION = "0123456789abcdef0123456789abcdef"


def entry(ts: int, message: str, **fields: Any) -> dict[str, Any]:
    return {"__REALTIME_TIMESTAMP": str(ts), "__CURSOR": f"c{ts}", "MESSAGE": message,
            "PRIORITY": "6", "_SYSTEMD_UNIT": "web.service", "_PID": "42", **fields}


class FakeJournal:
    """Answers like journalctl --reverse [--until=@T]: newest first."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = sorted(entries, key=lambda e: int(e["__REALTIME_TIMESTAMP"]))
        self.calls: list[tuple[list[str], int]] = []

    def __call__(self, argv: Sequence[str], limit: int) -> Result:
        self.calls.append((list(argv), limit))
        rows = [e for e in self.entries if _matches(e, argv)]
        bounds: tuple[tuple[str, Callable[[int, int], bool]], ...] = (
            ("--until=", lambda t, b: t <= b), ("--since=", lambda t, b: t >= b))
        for option, keep in bounds:
            value = next((a.split("=@")[1] for a in argv if a.startswith(option)), None)
            if value is not None:
                seconds, _, micros = value.partition(".")
                bound = int(seconds) * S + int(micros)
                rows = [e for e in rows if keep(int(e["__REALTIME_TIMESTAMP"]), bound)]
        if "--reverse" in argv:
            rows = list(reversed(rows))
        return Result(entries=rows[:limit])


def _matches(entry: dict[str, Any], argv: Sequence[str]) -> bool:
    """journalctl's matches: FIELD=value terms ANDed, groups split by "+"
    ORed; --unit=U as _SYSTEMD_UNIT=U or systemd's own UNIT=U lines."""
    groups: list[list[str]] = [[]]
    for arg in argv:
        if arg == "+":
            groups.append([])
        elif arg.startswith("--unit="):
            unit = arg.split("=", 1)[1]
            if entry.get("_SYSTEMD_UNIT") != unit and entry.get("UNIT") != unit:
                return False
        elif not arg.startswith("-") and "=" in arg:
            groups[-1].append(arg)
    groups = [g for g in groups if g]
    return not groups or any(
        all(str(entry.get(k)) == v for k, v in (term.split("=", 1) for term in group))
        for group in groups)


def failing_unit_journal() -> FakeJournal:
    rows = [entry(t * S, f"line {t}") for t in range(100, 200)]
    rows.append(entry(150 * S + 5, "web.service: Failed with result 'exit-code'.", PRIORITY="4",
                      MESSAGE_ID=FAILURE_MESSAGE_ID, _PID="1", UNIT="web.service",
                      _SYSTEMD_UNIT="init.scope", INVOCATION_ID=INVOCATION))
    return FakeJournal(rows)


def test_failure_found_from_the_newest_end() -> None:
    fake = failing_unit_journal()
    found = slice_unit(Source(), fake, "web.service", failure_usec=None, invocation_id=None,
                       before=5, after=3, after_usec=30 * S, now_usec=300 * S)
    assert found.failure_usec == 150 * S + 5
    assert found.invocation_id == INVOCATION
    assert [line.message for line in found.lines] == [
        "line 147", "line 148", "line 149", "line 150",
        "web.service: Failed with result 'exit-code'.", "line 151", "line 152", "line 153"]
    assert found.lines[4].unit == "web.service" and found.lines[4].pid == 1
    # One journalctl run, reading from the newest end, bounded.
    (argv, limit), = fake.calls
    assert "--reverse" in argv and "--unit=web.service" in argv and limit == 5 + 500


def test_given_failure_time_seeks_to_it() -> None:
    fake = failing_unit_journal()
    found = slice_unit(Source(directory="/j"), fake, "web.service", failure_usec=120 * S,
                       invocation_id=None, before=3, after=2, after_usec=5 * S, now_usec=300 * S)
    assert [line.message for line in found.lines] == [
        "line 118", "line 119", "line 120", "line 121", "line 122"]
    (back, _), (forward, limit) = fake.calls
    assert f"--until={at(120 * S)}" in back and "--reverse" in back and "--directory=/j" in back
    assert f"--since={at(120 * S + 1)}" in forward and f"--until={at(125 * S)}" in forward
    assert "--reverse" not in forward and limit == 2


def test_invocation_id_selects_by_invocation() -> None:
    fake = failing_unit_journal()
    slice_unit(Source(), fake, "web.service", failure_usec=None, invocation_id=INVOCATION,
               before=3, after=0, after_usec=0, now_usec=300 * S)
    (argv, _), = fake.calls
    assert f"_SYSTEMD_INVOCATION_ID={INVOCATION}" in argv and "+" in argv
    assert not any(a.startswith("--unit") for a in argv)


def test_a_failure_far_back_is_found_through_the_index() -> None:
    rows = [entry(t * S, f"line {t}") for t in range(100, 2000)]
    rows.append(entry(150 * S + 5, "web.service: Failed with result 'signal'.", PRIORITY="4",
                      MESSAGE_ID=FAILURE_MESSAGE_ID, _PID="1", UNIT="web.service",
                      INVOCATION_ID=INVOCATION))

    fake = FakeJournal(rows)
    found = slice_unit(Source(), fake, "web.service", failure_usec=None, invocation_id=None,
                       before=2, after=1, after_usec=5 * S, now_usec=3000 * S)
    assert found.failure_usec == 150 * S + 5 and found.invocation_id == INVOCATION
    assert [line.message for line in found.lines] == [
        "line 150", "web.service: Failed with result 'signal'.", "line 151"]
    index_call = fake.calls[1][0]
    assert "UNIT=web.service" in index_call and "_PID=1" in index_call


def test_no_failure_marker_means_now_and_the_newest_lines() -> None:
    fake = FakeJournal([entry(t * S, f"line {t}") for t in range(10)])
    found = slice_unit(Source(), fake, "web.service", failure_usec=None, invocation_id=None,
                       before=3, after=3, after_usec=S, now_usec=99 * S)
    assert found.failure_usec == 99 * S
    assert [line.message for line in found.lines] == ["line 7", "line 8", "line 9"]


def test_lines_after_a_flood_still_get_the_lines_before() -> None:
    rows = [entry(100 * S + i, f"before {i}") for i in range(5)]
    rows += [entry(200 * S + i, f"after {i}") for i in range(1000)]
    fake = FakeJournal(rows)
    found = slice_unit(Source(), fake, "web.service", failure_usec=150 * S, invocation_id=None,
                       before=2, after=2, after_usec=100 * S, now_usec=400 * S)
    assert [line.message for line in found.lines] == ["before 3", "before 4", "after 0",
                                                      "after 1"]
    assert all(limit <= 2 for _, limit in fake.calls)


def test_error_and_bad_entries_are_reported_not_raised() -> None:
    def broken(argv: Sequence[str], limit: int) -> Result:
        if f"MESSAGE_ID={FAILURE_MESSAGE_ID}" in argv:  # the index query finds nothing
            return Result(error="No journal files were found.")
        return Result(entries=[{"MESSAGE": "no time"}, entry(5, "ok")], skipped=2,
                      error="No journal files were found.")

    found = slice_unit(Source(), broken, "web.service", failure_usec=None, invocation_id=None,
                       before=5, after=0, after_usec=0, now_usec=10)
    assert found.error == "No journal files were found."
    assert found.skipped == 3
    assert [line.message for line in found.lines] == ["ok"]


def test_fields_as_journalctl_writes_them() -> None:
    assert text([104, 105, 255]) == "hi\ufffd"
    assert text(["first", "second"]) == "first"
    assert text(None) == ""
    line = line_of(entry(5, "x" * 10000, PRIORITY="bogus", _PID="nope"))
    assert line is not None and len(line.message) == 4096 and line.priority == 6
    assert line.pid is None
    assert line_of({"MESSAGE": "x"}) is None


def test_invocation_ids_and_kernel_arguments() -> None:
    assert is_invocation_id(INVOCATION)
    assert not is_invocation_id(INVOCATION.upper()) and not is_invocation_id("x; rm")
    argv = kernel_argv(Source(files=("/j/a.journal",)), None, 5 * S, follow=False)
    assert "--dmesg" in argv and "--since=@5.000000" in argv and "--file=/j/a.journal" in argv
    argv = kernel_argv(Source(), "s=abc", 0, follow=True)
    assert "--after-cursor=s=abc" in argv and "--follow" in argv and "--no-tail" in argv
