"""A local stand-in for the HuggingFace hub's file-download protocol, on 127.0.0.1.

It answers what `huggingface_hub.hf_hub_download` (2.x) asks when HF_ENDPOINT points at it
(file_download.py: get_hf_file_metadata, http_get):

- `HEAD /datasets/{repo}/resolve/{revision}/{path}`: the metadata. Every answer carries
  `X-Repo-Commit`. A large-file-storage (LFS) file answers 302 with `X-Linked-Etag` (the
  SHA-256 of its bytes), `X-Linked-Size` and `Location` on another origin (the "CDN" server
  below: the client follows redirects only on the hub's own origin, as it does for the real
  hub's CDN); a regular file answers 200 with `ETag` (its git blob id) and `Content-Length`.
  No `X-Xet-*` header is ever sent, so the client never takes its Xet path.
- `GET` of the resolved URL: the bytes, honouring `Range: bytes=N-` (206 + Content-Range),
  which the client sends to resume a transfer cut off midway.
- Unknown repositories or files: 404 with `X-Error-Code` RepoNotFound / EntryNotFound.

Faults for the tests: `cut_next_download(path, ...)` makes the next full GET of a file send
half its bytes and close the connection (with or without a Content-Length promising the
rest); the client's retry (a Range request from the last whole chunk it received, or the
whole file again when it received none) is then served or refused with 500.
Every request is logged (method, path, Range) so tests can see what the client really did.
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


@dataclass
class Fault:
    fraction: float = 0.5
    content_length: bool = True  # promise the whole size (the client sees a short body)
    then: str = "fail"  # what the client's retry gets: "fail" (500) or "serve"


@dataclass
class HubFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


@dataclass
class HubServer:
    files: dict[tuple[str, str], HubFile] = field(default_factory=dict)
    log: list[tuple[str, str, str | None]] = field(default_factory=list)
    faults: dict[str, Fault] = field(default_factory=dict)  # by sha256 of the file's bytes
    refuse_next: set[str] = field(default_factory=set)  # after a cut: the retry gets 500
    lying_etag: bool = False  # LFS files announce a SHA-256 their bytes do not have
    body_delay_s: float = 0.0  # a slow link: wait this long before sending a file's bytes

    def put(self, repo: str, path: str, data: bytes, *, lfs: bool = True) -> HubFile:
        self.files[(repo, path)] = HubFile(data, lfs)
        return self.files[(repo, path)]

    def cut_next_download(self, repo: str, path: str, **fault) -> None:
        self.faults[self.files[(repo, path)].sha256] = Fault(**fault)

    def requests(self, method: str) -> list[tuple[str, str | None]]:
        return [(path, rng) for m, path, rng in self.log if m == method]

    # ---- serving --------------------------------------------------------------------------
    def start(self) -> HubServer:
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=False))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn=True))
        for server in (self._hub, self._cdn):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def blob(self, sha256: str) -> HubFile | None:
        return next((f for f in self.files.values() if f.sha256 == sha256), None)


def _handler(hub: HubServer, *, cdn: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, *, body: bool) -> None:
            hub.log.append((self.command, self.path, self.headers.get("Range")))
            if cdn:
                sha = self.path.split("?")[0].rpartition("/")[2]
                found = hub.blob(sha)
                if found is None:
                    return self._status(404, {})
                return self._send_bytes(found, body)
            match = _RESOLVE.match(self.path.split("?")[0])
            if match is None:
                return self._status(404, {"X-Error-Code": "RepoNotFound"})
            repo, path = match["repo"], match["path"]
            if not any(r == repo for r, _ in hub.files):
                return self._status(404, {"X-Error-Code": "RepoNotFound"})
            found = hub.files.get((repo, path))
            common = {"X-Repo-Commit": COMMIT}
            if found is None:
                return self._status(404, {**common, "X-Error-Code": "EntryNotFound"})
            if found.lfs:
                etag = "0" * 64 if hub.lying_etag else found.sha256
                return self._status(
                    302,
                    {
                        **common,
                        "Location": f"{hub.cdn}/blobs/{found.sha256}?signed=1",
                        "X-Linked-Etag": f'"{etag}"',
                        "X-Linked-Size": str(len(found.data)),
                        "ETag": f'"{hashlib.sha1(found.sha256.encode()).hexdigest()}"',
                    },
                )
            if not body:
                return self._status(
                    200,
                    {**common, "ETag": f'"{found.git_oid}"', "Content-Length": len(found.data)},
                    length=False,
                )
            return self._send_bytes(found, body, {**common, "ETag": f'"{found.git_oid}"'})

        def _status(self, code: int, headers: dict, *, length: bool = True) -> None:
            self.send_response(code)
            for key, value in headers.items():
                self.send_header(key, str(value))
            if length:
                self.send_header("Content-Length", "0")
            self.end_headers()

        def _send_bytes(self, found: HubFile, body: bool, extra: dict | None = None) -> None:
            data, start = found.data, 0
            wanted = self.headers.get("Range")
            fault = hub.faults.get(found.sha256)
            if body and found.sha256 in hub.refuse_next:
                hub.refuse_next.discard(found.sha256)
                return self._status(500, {})
            if wanted and body:
                start = int(re.fullmatch(r"bytes=(\d+)-", wanted)[1])
            headers = dict(extra or {})
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            cut = fault is not None and body and not wanted
            if not cut or fault.content_length:
                headers["Content-Length"] = len(data) - start
            self.send_response(206 if start else 200)
            for key, value in headers.items():
                self.send_header(key, str(value))
            if cut:
                self.send_header("Connection", "close")
            self.end_headers()
            if not body:
                return
            time.sleep(hub.body_delay_s)
            if cut:
                del hub.faults[found.sha256]  # once; what the resume gets is `fault.then`
                if fault.then == "fail":
                    hub.refuse_next.add(found.sha256)
                self.wfile.write(data[: int(len(data) * fault.fraction)])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(data[start:])

    return Handler
