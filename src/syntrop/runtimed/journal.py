"""A stream's journal: the last bytes of what it said. Pure, and used on
both sides: a worker's sliding window (worker/sinks.py) and the face's
session with sinks (ExplainContext's journal)."""


class Journal:
    """The last `limit` bytes of a stream's text (cut at a character
    boundary), and how many bytes went through in all."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("journal limit must be positive")
        self.limit = limit
        self.total = 0
        self._buffer = bytearray()

    def append(self, text: str) -> None:
        data = text.encode()
        self.total += len(data)
        self._buffer += data
        excess = len(self._buffer) - self.limit
        if excess > 0:
            # Never start inside a UTF-8 sequence (continuation bytes 10xxxxxx).
            while excess < len(self._buffer) and self._buffer[excess] & 0xC0 == 0x80:
                excess += 1
            del self._buffer[:excess]

    @property
    def dropped(self) -> int:
        return self.total - len(self._buffer)

    def text(self) -> str:
        return self._buffer.decode(errors="replace")

    def __len__(self) -> int:
        return len(self._buffer)
