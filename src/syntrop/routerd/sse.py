"""Server-sent events: an incremental parser of the data fields."""


class SSEParser:
    """Feed bytes, get the data payload of each complete event."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._limit = limit

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        if len(self._buffer) > self._limit:
            raise ValueError("server-sent event too large")
        events: list[str] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return events
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8", "replace")
            self._buffer = self._buffer[end + 1:]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
            # comments (":") and other fields are ignored


def event(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"
