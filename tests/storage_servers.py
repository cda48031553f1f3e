"""Real storage servers on loopback for the tests, and a proxy that injects failures.

- `s3_endpoint` (session): moto's S3 server (moto.server.ThreadedMotoServer) with a bucket
  "podkit"; `s3` (per test): that endpoint and dummy credentials in the environment.
- `gcs_endpoint` (session): gcp-storage-emulator with a bucket "podkit"; `gcs` (per test):
  STORAGE_EMULATOR_HOST pointing at it.
- `FaultProxy`: forwards HTTP to a server, but answers chosen requests with an error first
  (503 SlowDown for throttling, 403 AccessDenied, or a dropped connection), counting what it
  saw; point AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST at `proxy.url`.

Servers bind port 0 (the kernel picks a free one: no race with other test runs) and are started
once per session by the first test that asks for them. The per-test fixtures set the
environment the libraries read and restore it afterwards.
"""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

BUCKET = "podkit"

# What the libraries would otherwise pick up from this machine's environment.
_FOREIGN_AWS = ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_MAX_ATTEMPTS",
                "AWS_RETRY_MODE")
AWS_ENV = dict(AWS_ACCESS_KEY_ID="podkit", AWS_SECRET_ACCESS_KEY="podkit-secret",
               AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull,
               AWS_SHARED_CREDENTIALS_FILE=os.devnull)


@contextmanager
def environ(**values: str | None) -> Iterator[None]:
    """Set (or, with None, remove) environment variables, restoring them afterwards."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def s3_env(endpoint: str) -> dict[str, str | None]:
    return {**dict.fromkeys(_FOREIGN_AWS), **AWS_ENV, "AWS_ENDPOINT_URL": endpoint}


def gcs_env(endpoint: str) -> dict[str, str | None]:
    return {"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "podkit"}


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    _wait_listening(port)
    endpoint = f"http://127.0.0.1:{port}"
    with environ(**s3_env(endpoint)):
        import boto3

        boto3.session.Session().client("s3").create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str) -> Iterator[str]:
    """The S3 server's endpoint and dummy credentials in the environment, for one test."""
    with environ(**s3_env(s3_endpoint)):
        yield s3_endpoint


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", 0, in_memory=True, default_bucket=BUCKET)
    server._api.daemon = True  # never keep the interpreter alive after the tests
    server.start()
    port = server._api._httpd.server_address[1]  # bound to port 0: ask which one it got
    _wait_listening(port)
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def gcs(gcs_endpoint: str) -> Iterator[str]:
    """STORAGE_EMULATOR_HOST pointing at the GCS emulator, for one test."""
    with environ(**gcs_env(gcs_endpoint)):
        yield gcs_endpoint


_HOP_BY_HOP = {"connection", "content-length", "transfer-encoding", "keep-alive", "expect",
               "proxy-connection", "te", "trailer", "upgrade"}


class FaultProxy:
    """An HTTP proxy to `upstream` that fails the next `fail` requests accepted by
    `when(method, path)`: with HTTP `status` and `body`, or (status=None) by dropping the
    connection without an answer. `seen` counts the requests `when` accepted, `log` lists
    (method, path, status answered) for every request."""

    def __init__(self, upstream: str, fail: int = 0, status: int | None = 503,
                 body: bytes = b"", content_type: str = "application/xml",
                 when: Callable[[str, str], bool] = lambda method, path: True) -> None:
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.fail, self.status, self.body, self.when = fail, status, body, when
        self.content_type = content_type
        self.seen = 0
        self.log: list[tuple[str, str, int | None]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, and answers Expect: 100-continue
            disable_nagle_algorithm = True  # headers and body go out in separate writes

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                data = self._body()
                with proxy.lock:
                    matched = proxy.when(self.command, self.path)
                    proxy.seen += matched
                    failing = matched and proxy.fail > 0
                    proxy.fail -= failing
                    status = proxy.status
                if failing and status is None:  # a connection reset, no answer
                    proxy.log.append((self.command, self.path, None))
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if failing:
                    proxy.log.append((self.command, self.path, status))
                    self.send_response(status)
                    self.send_header("Content-Type", proxy.content_type)
                    self.send_header("Content-Length", str(len(proxy.body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(proxy.body)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in _HOP_BY_HOP}
                    conn.request(self.command, self.path, body=data, headers=headers)
                    resp = conn.getresponse()
                    payload = resp.read()
                finally:
                    conn.close()
                proxy.log.append((self.command, self.path, resp.status))
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP_BY_HOP:
                        self.send_header(k, v)
                # a HEAD answer has no body but tells the object's length
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
ACCESS_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                 b"<Message>Access Denied</Message></Error>")
GCS_BUSY = (b'{"error": {"code": 503, "message": "Backend Error", "errors": [{"reason": '
            b'"backendError", "message": "Backend Error"}]}}')
GCS_DENIED = (b'{"error": {"code": 403, "message": "podkit@example.iam does not have '
              b'storage.objects.create access to the Google Cloud Storage object.", '
              b'"errors": [{"reason": "forbidden"}]}}')
