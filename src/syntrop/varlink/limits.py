"""What one client may cost a syntrop daemon's Varlink server."""

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What one client may cost us. Defaults follow sd-varlink."""

    max_message: int = 16 * MiB
    max_connections: int = 4096
    max_connections_per_uid: int = 1024
    #: A message begun and not ended within this many seconds closes its
    #: connection (slowloris). sd-varlink's idle timeout is 45 s.
    partial_timeout: float = 30.0
    #: Bytes of unfinished input buffered for one uid, and for everyone:
    #: a read past either closes the connection that made it, so a uid at
    #: its cap loses its own connections and nobody else's.
    max_buffered_per_uid: int = 32 * MiB
    max_buffered: int = 128 * MiB
    #: Exit after this many seconds with no connection and nothing pending.
    idle_timeout: float | None = None
