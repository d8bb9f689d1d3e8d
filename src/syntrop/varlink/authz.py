"""Who may call what, one rule for every daemon.

A method that changes something either concerns the caller's own things
(its lease, its pid, its unit) or is privileged. A caller is let through
when it is

- root, or the daemon's own uid (dev mode runs the daemons as the user);
- the owner of the thing (`owner_uid`), for methods on the caller's own;
- authorized by polkit for the method's action (io.syntrop.*, installed by
  scripts/install as data/polkit/io.syntrop.policy; the shipped rule grants
  the `syntrop` group the operator actions).

Anyone else gets the interface's declared `NotAuthorized` error naming the
action. Where polkit cannot be asked (no system bus, no polkitd, no answer
within `POLKIT_TIMEOUT`) the answer is the same refusal, never permission.

Every interface declares its own `NotAuthorized` through `not_authorized()`
(Varlink errors belong to an interface), and passes it here.
"""

import asyncio
import logging
import os
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


def privileged(peer: Peer, owner_uid: int | None = None) -> bool:
    """Root, the daemon's own uid, or the owner: no polkit needed."""
    return peer.uid in (0, os.geteuid()) or (owner_uid is not None and peer.uid == owner_uid)


async def authorize(action: str, error: type[TypedVarlinkErrorReply], *,
                    owner_uid: int | None = None) -> Peer:
    """The caller, when it may do `action` (see the module); else `error`
    naming the action. Only valid inside a Varlink method."""
    peer = current_peer()
    if privileged(peer, owner_uid):
        return peer
    if await checker.check(action, peer):
        return peer
    logger.info("%s refused to uid %d pid %d", action, peer.uid, peer.pid)
    raise error(action=action)


async def allowed(action: str, *, owner_uid: int | None = None) -> bool:
    """Whether the caller may do `action`, without raising."""
    peer = current_peer()
    return privileged(peer, owner_uid) or await checker.check(action, peer)
