"""Real storage servers on loopback for the tests, and a proxy that injects failures.

- `s3_server`: moto's S3 server (moto.server.ThreadedMotoServer), a bucket "podkit".
- `gcs_server`: gcp-storage-emulator, a bucket "podkit".
- `FaultProxy`: forwards HTTP to a server, but answers chosen requests with an error first
  (503 for transient failures, 403 for a permission error), counting what it saw.

The fixtures set the environment the libraries read (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST,
credentials) for the test that uses them and restore it afterwards.
"""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import threading
import time
from contextlib import contextmanager

import pytest

BUCKET = "podkit"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@contextmanager
def environ(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


AWS_ENV = dict(AWS_ACCESS_KEY_ID="podkit", AWS_SECRET_ACCESS_KEY="podkit-secret",
               AWS_DEFAULT_REGION="us-east-1")


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    _wait_listening(port)
    endpoint = f"http://127.0.0.1:{port}"
    with environ(**AWS_ENV, AWS_ENDPOINT_URL=endpoint):
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture
def s3(s3_endpoint):
    """The S3 server's endpoint in the environment, for one test."""
    with environ(**AWS_ENV, AWS_ENDPOINT_URL=s3_endpoint):
        yield s3_endpoint


@pytest.fixture(scope="session")
def gcs_endpoint():
    from gcp_storage_emulator.server import create_server

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    _wait_listening(port)
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def gcs(gcs_endpoint):
    with environ(STORAGE_EMULATOR_HOST=gcs_endpoint, GOOGLE_CLOUD_PROJECT="podkit"):
        yield gcs_endpoint


class FaultProxy:
    """An HTTP proxy to `upstream` that fails the first `fail` requests accepted by `when`
    (method, path) with `status`, then forwards. `seen` counts the requests `when` accepted."""

    def __init__(self, upstream: str, fail: int = 0, status: int = 503, body: bytes = b"",
                 when=lambda method, path: True) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.fail, self.status, self.body, self.when = fail, status, body, when
        self.seen = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                data = self._body()
                with proxy.lock:
                    matched = proxy.when(self.command, self.path)
                    proxy.seen += matched
                    failing = matched and proxy.fail > 0
                    proxy.fail -= failing
                if failing:
                    self.send_response(proxy.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(proxy.body)))
                    self.end_headers()
                    self.wfile.write(proxy.body)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection", "content-length",
                                                "transfer-encoding")}
                conn.request(self.command, self.path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                # a HEAD answer has no body but tells the object's length
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                conn.close()

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
ACCESS_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                 b"<Message>Access Denied</Message></Error>")
