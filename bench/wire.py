"""A minimal blocking Varlink client for the daemon benchmarks: one
connection, one call at a time, no library between the benchmark and the
socket."""

import json
import socket
from pathlib import Path
from typing import Any


class Wire:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.buffer = b""

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.sock.sendall(json.dumps({"method": method, "parameters": params}).encode() + b"\0")
        while b"\0" not in self.buffer:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        reply: dict[str, Any] = json.loads(message)
        if "error" in reply:
            raise RuntimeError(f"{reply['error']}: {reply.get('parameters')}")
        parameters: dict[str, Any] = reply.get("parameters", {})
        return parameters

    def close(self) -> None:
        self.sock.close()
