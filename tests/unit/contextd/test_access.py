"""Who gets a unit's journal lines: root, the journal's reader groups, the
uid the unit runs as; a stranger gets none and the reason."""

from syntrop.contextd.access import REFUSED, groups_of, may_read, unit_uid, visible
from syntrop.contextd.journal import Line, line_of

OWN = 990  # contextd's own (dynamic) uid
ALICE = 1000
BOB = 1001


def line(unit: str | None, uid: int | None, *, pid: int = 42, owner: int | None = None,
         message: str = "m") -> Line:
    return Line(timestamp_usec=1, priority=6, message=message, unit=unit, pid=pid,
                cursor="c", uid=uid, owner_uid=owner)


def test_the_decision() -> None:
    none: frozenset[str] = frozenset()
    assert may_read(0, none, None, own_uid=OWN)  # root
    assert may_read(OWN, none, None, own_uid=OWN)  # contextd's own uid (dev mode)
    assert may_read(BOB, frozenset({"users", "systemd-journal"}), None, own_uid=OWN)
    assert may_read(BOB, frozenset({"adm"}), ALICE, own_uid=OWN)
    assert may_read(ALICE, none, ALICE, own_uid=OWN)  # the unit's uid
    assert not may_read(BOB, frozenset({"users", "wheel"}), ALICE, own_uid=OWN)  # a stranger
    assert not may_read(BOB, none, None, own_uid=OWN)  # a unit without an owner


def test_the_units_uid_is_its_own_lines_one_uid() -> None:
    assert unit_uid("web.service", [line("web.service", ALICE),
                                    line("web.service", 0, pid=1)]) == ALICE  # pid 1 aside
    # A user's session: its owner, though sudo in it logs as root.
    session = [line("session-3.scope", ALICE, owner=ALICE),
               line("session-3.scope", 0, owner=ALICE, message="sudo: COMMAND=/bin/sh")]
    assert unit_uid("session-3.scope", session) == ALICE
    assert unit_uid("web.service", [line("web.service", ALICE), line("web.service", 0)]) is None
    assert unit_uid("web.service", [line("web.service", 0, pid=1)]) is None
    assert unit_uid("web.service", [line("web.service", None)]) is None
    assert unit_uid("web.service", [line("sshd.service", ALICE)]) is None
    assert unit_uid("web.service", []) is None


def test_what_each_caller_sees() -> None:
    lines = [line("sshd.service", 0, message="Accepted password for root")]
    assert visible("sshd.service", lines, caller_uid=0, groups=frozenset(),
                   own_uid=OWN) == (lines, None)
    assert visible("sshd.service", lines, caller_uid=BOB, groups=frozenset({"adm"}),
                   own_uid=OWN) == (lines, None)
    assert visible("sshd.service", lines, caller_uid=BOB, groups=frozenset({"users"}),
                   own_uid=OWN) == ([], REFUSED)
    assert visible("sshd.service", [], caller_uid=BOB, groups=frozenset(),
                   own_uid=OWN) == ([], REFUSED)
    mine = [line("web.service", ALICE), line("web.service", 0, pid=1)]
    assert visible("web.service", mine, caller_uid=ALICE, groups=frozenset(),
                   own_uid=OWN) == (mine, None)
    assert visible("web.service", mine, caller_uid=BOB, groups=frozenset(),
                   own_uid=OWN) == ([], REFUSED)


def test_an_owner_gets_only_the_unit_it_named() -> None:
    # An invocation id of another unit selects that unit's lines: its own
    # unit's name does not make them the caller's.
    others = [line("sshd.service", 0, message="secret")]
    assert visible("web.service", others, caller_uid=ALICE, groups=frozenset(),
                   own_uid=OWN) == ([], REFUSED)
    mixed = [line("web.service", ALICE), line("cron.service", 0, message="secret")]
    assert visible("web.service", mixed, caller_uid=ALICE, groups=frozenset(),
                   own_uid=OWN) == (mixed[:1], None)


def test_groups_come_from_the_account_databases() -> None:
    assert "root" in groups_of(0)
    assert groups_of(-1) == frozenset()
    assert groups_of(2**31 - 2) == frozenset()  # no such account


def test_lines_carry_journalds_uids() -> None:
    raw = {"__REALTIME_TIMESTAMP": "1", "__CURSOR": "c", "MESSAGE": "m",
           "_SYSTEMD_UNIT": "session-3.scope", "_PID": "7", "_UID": "0",
           "_SYSTEMD_OWNER_UID": "1000"}
    parsed = line_of(raw)
    assert parsed is not None and (parsed.uid, parsed.owner_uid) == (0, ALICE)
    bare = line_of({"__REALTIME_TIMESTAMP": "1", "__CURSOR": "c"})
    assert bare is not None and (bare.uid, bare.owner_uid) == (None, None)
