"""Who may call what, one rule for every daemon.

A method that changes something either concerns the caller's own things
(its lease, its pid, its unit) or is privileged. A caller is let through
when it is

- root;
- one of the daemon accounts the method names (`allow`: a daemon that calls
  another's method, e.g. routerd's fleet hand-off calling runtimed's
  Prefill), resolved to uids once;
- the owner of the thing (`owner_uid`), for methods on the caller's own;
- the daemon's own uid in dev mode only (`syn up` runs every daemon as the
  user who started it): a daemon running as one of `DAEMON_ACCOUNTS` lets
  no caller through for sharing its uid;
- authorized by polkit for the method's action (io.syntrop.*, installed by
  scripts/install as data/polkit/io.syntrop.policy; the shipped rule grants
  the `syntrop` group's members the operator actions, except the daemon
  accounts, which are in that group too).

Anyone else gets the interface's declared `NotAuthorized` error naming the
action. Where polkit cannot be asked (no system bus, no polkitd, no answer
within `POLKIT_TIMEOUT`) the answer is the same refusal, never permission.

Every interface declares its own `NotAuthorized` through `not_authorized()`
(Varlink errors belong to an interface), and passes it here.
"""

import asyncio
import functools
import logging
import os
import pwd
from typing import Any

from asyncvarlink import TypedVarlinkErrorReply

from syntrop.varlink.peer import Peer, current_peer

logger = logging.getLogger(__name__)

#: How long a polkit check may take before the call is refused.
POLKIT_TIMEOUT = 5.0

# The actions, as data/polkit/io.syntrop.policy declares them.
LEASE_OTHERS = "io.syntrop.inference.lease-others"
EMERGENCY = "io.syntrop.inference.emergency"
MANAGE_PLANES = "io.syntrop.inference.manage"
MANAGE_MODELS = "io.syntrop.model.manage"
READ_MODELS = "io.syntrop.model.read"
MANAGE_RUNTIME = "io.syntrop.runtime.manage"
MANAGE_ROUTER = "io.syntrop.router.manage"
TRIAGE = "io.syntrop.sentry.triage"
REMEDIATE = "io.syntrop.tool.execute"


# The static accounts scripts/install makes, one per daemon that is not root
# (units/*.service User=), all in the `syntrop` group.
MODEL_USER = "syntrop-model"
RUNTIME_USER = "syntrop-runtime"
ROUTER_USER = "syntrop-router"
#: Accounts daemons run as in production, the one they shared before too:
#: running as one of them, a daemon's own uid is no privilege.
DAEMON_ACCOUNTS = ("syntrop", MODEL_USER, RUNTIME_USER, ROUTER_USER)


def not_authorized(interface: str) -> type[TypedVarlinkErrorReply]:
    """The `NotAuthorized` error of `interface`."""

    class NotAuthorized(TypedVarlinkErrorReply, interface=interface):
        """The caller may not do this: it is not root, does not own what it
        names, and polkit did not authorize the action (or could not be
        asked).

        Parameters:
            action: The polkit action it needed (io.syntrop.*).
        """

        class Parameters:
            action: str

    return NotAuthorized


class _Checker:
    """The process's one polkit connection, opened at the first check that
    needs it. Tests replace `check` with a fake for pure logic."""

    def __init__(self) -> None:
        self._authority: Any = None

    async def check(self, action: str, peer: Peer) -> bool:
        from syntrop.system import process
        from syntrop.system.polkit import Authority, PolkitUnavailable, Subject

        if peer.pid <= 0:
            return False  # no credentials: nothing polkit could vouch for
        # A daemon under ProtectProc=invisible cannot read another uid's
        # /proc entry: start time 0 has polkit look it up, and the uid we
        # pass (SO_PEERCRED's) must match the process it finds.
        start = process.start_time(peer.pid) or 0
        if self._authority is None:
            self._authority = Authority()
        try:
            return await asyncio.wait_for(self._authority.check(
                action, Subject(pid=peer.pid, start_time=start, uid=peer.uid)), POLKIT_TIMEOUT)
        except (PolkitUnavailable, TimeoutError) as error:
            logger.info("%s for uid %d pid %d: polkit not asked (%s): refused",
                        action, peer.uid, peer.pid, error or "timeout")
            return False


checker = _Checker()


@functools.cache
def uid_of(account: str) -> int | None:
    """The uid of `account`, looked up once; None where it does not exist."""
    try:
        return pwd.getpwnam(account).pw_uid
    except KeyError:
        return None


def _dev_mode(own_uid: int) -> bool:
    """Whether this daemon runs as an ordinary user (`syn up`), not as root
    or one of the daemon accounts."""
    return own_uid != 0 and own_uid not in {uid_of(a) for a in DAEMON_ACCOUNTS}


def privileged(peer: Peer, owner_uid: int | None = None, *,
               allow: tuple[str, ...] = ()) -> bool:
    """Root, a daemon account in `allow`, the owner, or (dev mode only) the
    daemon's own uid: no polkit needed."""
    if peer.uid < 0:
        return False  # no credentials
    if peer.uid == 0 or (owner_uid is not None and peer.uid == owner_uid):
        return True
    if any(peer.uid == uid_of(account) for account in allow):
        return True
    own = os.geteuid()
    return peer.uid == own and _dev_mode(own)


async def authorize(action: str, error: type[TypedVarlinkErrorReply], *,
                    owner_uid: int | None = None, allow: tuple[str, ...] = ()) -> Peer:
    """The caller, when it may do `action` (see the module); else `error`
    naming the action. Only valid inside a Varlink method."""
    peer = current_peer()
    if privileged(peer, owner_uid, allow=allow):
        return peer
    if await checker.check(action, peer):
        return peer
    logger.info("%s refused to uid %d pid %d", action, peer.uid, peer.pid)
    raise error(action=action)


async def allowed(action: str, *, owner_uid: int | None = None,
                  allow: tuple[str, ...] = ()) -> bool:
    """Whether the caller may do `action`, without raising."""
    peer = current_peer()
    return privileged(peer, owner_uid, allow=allow) or await checker.check(action, peer)
