"""A loopback HTTP proxy in front of fake-gcs-server that answers GCS JSON-API batch requests.

fake-gcs-server implements objects, uploads, rewrites and preconditions (``ifGenerationMatch``)
but answers ``POST /batch/storage/v1`` with an empty multipart body, and Beam's GCS filesystem
moves and deletes files only through batches (``copy_batch``, ``delete_batch``).  This proxy
passes every other request through unchanged and splits a batch into its sub-requests, sends
each to the server in turn and packs the answers as the batch API does.  It adds no storage
logic of its own: what is tested is the server's behaviour.
"""

from __future__ import annotations

import http.client
import threading
import uuid
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class _Handler(BaseHTTPRequestHandler):
    upstream: tuple[str, int] = ("127.0.0.1", 0)
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in _HOP}
            sent["Content-Length"] = str(len(body))
            conn.request(method, target, body=body, headers=sent)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def _handle(self) -> None:
        body = self._body()
        if urlsplit(self.path).path.rstrip("/").endswith("/batch/storage/v1"):
            status, reason, headers, data = self._batch(body)
        else:
            status, reason, headers, data = self._forward(
                self.command, self.path, dict(self.headers.items()), body
            )
        self.send_response(status, reason)
        for k, v in headers:
            if k.lower() not in _HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _batch(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        ctype = self.headers.get("Content-Type", "")
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {ctype}\r\n\r\n".encode() + body
        )
        boundary = uuid.uuid4().hex
        out: list[bytes] = []
        for part in message.iter_parts():
            raw = part.get_payload(decode=True) or b""
            head, _, sub_body = raw.partition(b"\r\n\r\n")
            lines = head.decode("utf-8").split("\r\n")
            method, uri, _ = lines[0].split(" ", 2)
            sub_headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            target = urlsplit(uri)
            path = target.path + (f"?{target.query}" if target.query else "")
            status, reason, headers, data = self._forward(method, path, sub_headers, sub_body)
            content_id = str(part.get("Content-ID", "")).strip("<>")
            sub_type = dict((k.lower(), v) for k, v in headers).get(
                "content-type", "application/json"
            )
            out.append(
                (
                    f"--{boundary}\r\nContent-Type: application/http\r\n"
                    f"Content-ID: <response-{content_id}>\r\n\r\n"
                    f"HTTP/1.1 {status} {reason}\r\nContent-Type: {sub_type}\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n"
                ).encode()
                + data
                + b"\r\n"
            )
        out.append(f"--{boundary}--\r\n".encode())
        headers = [("Content-Type", f"multipart/mixed; boundary={boundary}")]
        return 200, "OK", headers, b"".join(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle


class BatchProxy:
    """``BatchProxy(upstream_port).start()`` listens on 127.0.0.1 (a free port: ``.port``)."""

    def __init__(self, upstream_port: int) -> None:
        handler = type("Handler", (_Handler,), {"upstream": ("127.0.0.1", upstream_port)})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> BatchProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
