"""A real HTTP server on loopback serving files in both registry layouts,
with faults on demand. Used by the unit and service tests and the bench.

Hugging Face layout (as the Hub answers huggingface_hub):
    HEAD/GET /{org}/{repo}/resolve/{revision}/{file}
        -> 302 to /cdn/{sha256}, with X-Linked-Etag: "{sha256}", X-Linked-Size,
           X-Repo-Commit, ETag
    GET /cdn/{sha256}                         the bytes (Range: bytes=N- supported)
ollama layout (OCI distribution):
    GET /v2/{namespace}/{model}/manifests/{tag}   manifest JSON with a model layer
    GET /v2/{namespace}/{model}/blobs/sha256:{hex}
Plain files:
    HEAD/GET /files/{name}

Faults (attributes, changed by tests while it runs):
    ranges = False           answer Range requests with 200 and the whole body
    cut_after = N, cuts = K  the next K blob bodies stop after N bytes (connection closed)
    pause_after = N          blob bodies stop after N bytes until `resume` is set
    fail = {prefix: status}  requests whose path starts with prefix get status
    corrupt = True           blob bodies have one byte flipped (the digest stays)
    token = "t"              resolve/cdn requests need "Authorization: Bearer t"
"""

import contextlib
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


class LoopbackRegistry:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.blobs: dict[str, Path] = {}
        self.hf: dict[str, str] = {}  # "/org/repo/resolve/rev/file" -> sha256
        self.manifests: dict[str, bytes] = {}  # "/v2/ns/model/manifests/tag" -> JSON
        self.plain: dict[str, str] = {}  # "/files/name" -> sha256
        self.requests: list[Request] = []
        self.ranges = True
        self.cut_after: int | None = None
        self.cuts = 0
        self.pause_after: int | None = None
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.fail: dict[str, int] = {}
        self.corrupt = False
        self.token: str | None = None
        self.lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)  # an IPv4 TCP server's
        return f"http://{host}:{port}"

    @property
    def host(self) -> str:
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)  # an IPv4 TCP server's
        return f"{host}:{port}"

    def start(self) -> "LoopbackRegistry":
        self.thread.start()
        return self

    def close(self) -> None:
        self.resume.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    # content ----------------------------------------------------------------

    def blob(self, data: bytes | Path) -> str:
        if isinstance(data, Path):
            sha = _sha256_file(data)
            self.blobs[sha] = data
            return sha
        sha = hashlib.sha256(data).hexdigest()
        path = self.directory / sha
        path.write_bytes(data)
        self.blobs[sha] = path
        return sha

    def add_hf(self, repo_id: str, filename: str, data: bytes | Path,
               revision: str = "main") -> str:
        sha = self.blob(data)
        self.hf[f"/{repo_id}/resolve/{revision}/{filename}"] = sha
        return sha

    def add_ollama(self, namespace: str, model: str, tag: str, data: bytes | Path) -> str:
        sha = self.blob(data)
        size = self.blobs[sha].stat().st_size
        config = self.blob(b'{"model_format":"gguf"}')
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": f"sha256:{config}", "size": 23},
            "layers": [
                {"mediaType": "application/vnd.ollama.image.model",
                 "digest": f"sha256:{sha}", "size": size},
                {"mediaType": "application/vnd.ollama.image.license",
                 "digest": f"sha256:{self.blob(b'Apache-2.0')}", "size": 10},
            ],
        }
        self.manifests[f"/v2/{namespace}/{model}/manifests/{tag}"] = json.dumps(manifest).encode()
        return sha

    def add_file(self, name: str, data: bytes | Path) -> str:
        sha = self.blob(data)
        self.plain[f"/files/{name}"] = sha
        return sha

    def blob_gets(self) -> list[Request]:
        """GETs of blob bytes, in order."""
        return [r for r in self.requests if r.method == "GET"
                and (r.path.startswith("/cdn/") or "/blobs/" in r.path
                     or r.path.startswith("/files/"))]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _handler(registry: LoopbackRegistry) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def _serve(self, *, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            with registry.lock:
                registry.requests.append(Request(self.command, path, self.headers.get("Range"),
                                                 self.headers.get("Authorization")))
            for prefix, status in registry.fail.items():
                if path.startswith(prefix):
                    self._empty(status, {"X-Error-Message": f"injected {status}"})
                    return
            guarded = path.startswith("/cdn/") or "/resolve/" in path
            if (registry.token is not None and guarded
                    and self.headers.get("Authorization") != f"Bearer {registry.token}"):
                self._empty(401, {"X-Error-Code": "GatedRepo",
                                  "X-Error-Message": "Access to this repository is restricted"})
                return
            if path in registry.hf:
                linked = registry.hf[path]
                size = registry.blobs[linked].stat().st_size
                self._empty(302, {
                    "Location": f"{registry.url}/cdn/{linked}", "X-Linked-Etag": f'"{linked}"',
                    "X-Linked-Size": str(size), "X-Repo-Commit": "0" * 40, "ETag": '"0a1b"',
                })
                return
            if path in registry.manifests:
                body = registry.manifests[path]
                self._body(200, body, {"Content-Type":
                                       "application/vnd.docker.distribution.manifest.v2+json"},
                           head=head)
                return
            sha = None
            if path.startswith("/cdn/"):
                sha = path.removeprefix("/cdn/")
            elif "/blobs/sha256:" in path and path.startswith("/v2/"):
                sha = path.rsplit("sha256:", 1)[1]
            elif path in registry.plain:
                sha = registry.plain[path]
            if sha is None or sha not in registry.blobs:
                self._empty(404, {"X-Error-Code": "EntryNotFound",
                                  "X-Error-Message": "no such file"})
                return
            self._blob(registry.blobs[sha], sha, head=head)

        def _empty(self, status: int, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _body(self, status: int, body: bytes, headers: dict[str, str], *, head: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _blob(self, path: Path, sha: str, *, head: bool) -> None:
            size = path.stat().st_size
            start, end = 0, size
            match = _RANGE.fullmatch(self.headers.get("Range", ""))
            status = 200
            headers = {"ETag": f'"{sha}"', "Accept-Ranges": "bytes" if registry.ranges else "none",
                       "Content-Type": "application/octet-stream"}
            if match is not None and registry.ranges:
                start = int(match[1])
                end = min(size, int(match[2]) + 1) if match[2] else size
                if start >= size:
                    self._empty(416, {"Content-Range": f"bytes */{size}"})
                    return
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            if head:
                return
            self._send(path, start, end)

        def _send(self, path: Path, start: int, end: int) -> None:
            with registry.lock:
                cut = None
                if registry.cut_after is not None and registry.cuts > 0:
                    registry.cuts -= 1
                    cut = registry.cut_after
                pause = registry.pause_after
            stop = end if cut is None else min(end, start + cut)
            with contextlib.suppress(OSError), path.open("rb") as file:
                if registry.corrupt:
                    data = bytearray(file.read())[start:stop]
                    if data:
                        data[len(data) // 2] ^= 0xFF
                    self.wfile.write(data)
                elif pause is not None:
                    first = min(stop, start + pause)
                    self.connection.sendfile(file, start, first - start)
                    registry.paused.set()
                    registry.resume.wait(60)
                    if first < stop:
                        self.connection.sendfile(file, first, stop - first)
                else:
                    self.connection.sendfile(file, start, stop - start)
            if stop < end:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    import socket

                    self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[LoopbackRegistry]:
    registry = LoopbackRegistry(directory).start()
    try:
        yield registry
    finally:
        registry.close()
