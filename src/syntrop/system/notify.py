"""sd_notify(3) without libsystemd: READY=1, STATUS=, WATCHDOG=1, STOPPING=1.

The protocol is one datagram of newline-separated assignments sent to the
AF_UNIX socket named by $NOTIFY_SOCKET ('@' means the abstract namespace).
Without $NOTIFY_SOCKET every call is a no-op, so daemons call it
unconditionally.
"""

import logging
import os
import socket

logger = logging.getLogger(__name__)


def notify(*assignments: str) -> bool:
    """Send assignments such as "READY=1" to the service manager.

    Returns True when a manager was told, False when none is listening.
    Failures are logged and ignored: a daemon must not die because its
    supervisor went away.
    """
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not assignments:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    payload = "\n".join(assignments).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(payload, address)
    except OSError as error:
        logger.warning("sd_notify %s failed: %s, ignoring", assignments[0], error)
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings, or None when no watchdog is armed.

    Half of $WATCHDOG_USEC, as sd_watchdog_enabled(3) recommends, and only
    when $WATCHDOG_PID (if set) names this process.
    """
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec:
        return None
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 2_000_000
