"""Logging set-up shared by every daemon.

Under systemd (JOURNAL_STREAM or INVOCATION_ID set) each line starts with the
sd-daemon(3) priority prefix <N> so the journal records the right level.
SYNTROP_DEBUG=module,module turns on debug for those loggers only
(e.g. SYNTROP_DEBUG=syntrop.varlink); SYNTROP_DEBUG=all for everything.
"""

import logging
import os
import sys

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6)
        return f"<{priority}>{super().format(record)}"


def setup(program: str) -> None:
    """Configure the root logger for a daemon or CLI named `program`."""
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        # No journal to stamp the lines (dev mode, a terminal): stamp them.
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s.%(msecs)03d {program}: %(levelname)s %(name)s: %(message)s",
            datefmt="%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    debug = os.environ.get("SYNTROP_DEBUG", "")
    for name in filter(None, (part.strip() for part in debug.split(","))):
        if name == "all":
            root.setLevel(logging.DEBUG)
        else:
            logging.getLogger(name).setLevel(logging.DEBUG)
