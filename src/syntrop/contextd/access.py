"""Who may have a unit's journal lines from GetUnitContext.

contextd reads the whole journal (it runs in the systemd-journal and adm
groups); a caller gets the lines only when it could read them itself, or
when the unit is its own:

- root, or contextd's own uid (dev mode runs the daemons as the user);
- a member of systemd-journal or adm, the groups journald lets read the
  system journal;
- the uid the unit runs as. The slice itself says which: every line the
  unit's processes wrote carries journald's trusted _SYSTEMD_OWNER_UID (a
  user's session scope or user@.service) or else _UID (its User=).
  systemd's own lines about the unit (pid 1) do not count; a slice whose
  lines name no uid, or several, has no owner and goes to the first two
  only. That owner gets only the lines of the unit it named (an
  invocation id of another unit yields none).

Group membership is the passwd and group databases' answer for the uid
(polkit's unix-group rule, which authz relies on, asks the same): contextd
runs with ProtectProc=invisible and cannot read another uid's
/proc/PID/status, and a database lookup has no pid to be reused.

Anyone else gets no lines and `REFUSED` in journal_error; events, diffs
and packages do not depend on this.
"""

import grp
import os
import pwd
from collections.abc import Iterable, Set

from syntrop.contextd.journal import Line

#: Groups whose members may read the system journal.
READER_GROUPS = frozenset({"systemd-journal", "adm"})

REFUSED = ("journal lines are given to root, the systemd-journal and adm groups "
           "and the uid the unit runs as; not to this caller")


def groups_of(uid: int) -> frozenset[str]:
    """The names of the groups `uid` is in by the passwd and group
    databases; none for a uid without an account."""
    try:
        account = pwd.getpwuid(uid)
        gids = os.getgrouplist(account.pw_name, account.pw_gid)
    except (KeyError, OSError, OverflowError):
        return frozenset()
    names = set()
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return frozenset(names)


def unit_uid(unit: str, lines: Iterable[Line]) -> int | None:
    """The uid `unit` runs as, by its own lines (see the module)."""
    own = [line for line in lines if line.unit == unit and line.pid != 1]
    for uids in ({line.owner_uid for line in own}, {line.uid for line in own}):
        if len(uids) == 1 and None not in uids:
            return uids.pop()
    return None


def may_read(caller_uid: int, groups: Set[str], owner_uid: int | None, *,
             own_uid: int) -> bool:
    """Whether the caller may have a unit's journal lines (see the module)."""
    return (caller_uid in (0, own_uid) or not groups.isdisjoint(READER_GROUPS)
            or (owner_uid is not None and caller_uid == owner_uid))


def visible(unit: str, lines: list[Line], *, caller_uid: int, groups: Set[str],
            own_uid: int) -> tuple[list[Line], str | None]:
    """The lines the caller may have, and why none when it may have none."""
    if may_read(caller_uid, groups, None, own_uid=own_uid):
        return lines, None
    mine = [line for line in lines if line.unit == unit]
    if mine and may_read(caller_uid, groups, unit_uid(unit, mine), own_uid=own_uid):
        return mine, None
    return [], REFUSED
