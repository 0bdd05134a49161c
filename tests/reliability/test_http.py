"""The HTTP side of a real server started with --api-key and --private-metrics: browsers from other origins
are refused whatever Host header they send (DNS rebinding), any API key compares without a server error,
HEAD has no body, /metrics needs the key, and an unknown path or method is a JSON error."""

from __future__ import annotations

import base64
import json
import os
import socket

import pytest
from rel_helpers import ServerProcess

KEY = "clé-secrète"


@pytest.fixture(scope="module")
def keyed():
    srv = ServerProcess(
        "--transcription-only", "--api-key", KEY, "--private-metrics", "--allow-origin", "https://app.example"
    )
    yield srv
    assert srv.stop() == 0


def raw(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send raw HTTP bytes -> (status, headers, body read until the server closes or 2 s pass; a 101 Switching
    Protocols has no body: its head is all that is read)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        s.settimeout(2)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
                if data.startswith(b"HTTP/1.1 101 ") and b"\r\n\r\n" in data:
                    break
        except TimeoutError:
            pass
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def handshake(port: int, host: str, origin: str | None, auth: bytes | None = None) -> int:
    key = base64.b64encode(os.urandom(16)).decode()
    req = (
        f"GET /v1/realtime?intent=transcription HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    ).encode()
    if origin:
        req += f"Origin: {origin}\r\n".encode()
    req += b"Authorization: Bearer " + (auth if auth is not None else KEY.encode("utf-8")) + b"\r\n\r\n"
    return raw(port, req)[0]


def test_dns_rebinding_is_refused(keyed):
    p = keyed.port
    assert handshake(p, f"evil.example:{p}", f"http://evil.example:{p}") == 403  # Host is the attacker's
    assert handshake(p, f"127.0.0.1:{p}", f"http://127.0.0.1:{p}") == 101  # the demo page served here
    assert handshake(p, f"localhost:{p}", f"http://localhost:{p}") == 101
    assert handshake(p, f"127.0.0.1:{p}", "https://app.example") == 101  # --allow-origin
    assert handshake(p, f"127.0.0.1:{p}", None) == 101  # not a browser


def test_any_api_key_compares_without_a_server_error(keyed):
    p = keyed.port
    assert handshake(p, f"127.0.0.1:{p}", None, "wrong-ключ".encode()) == 401
    assert handshake(p, f"127.0.0.1:{p}", None, b"\xff\xfe") == 401
    assert handshake(p, f"127.0.0.1:{p}", None, KEY.encode("utf-8")) == 101  # a non-ASCII key works


def test_head_has_no_body_and_errors_are_json(keyed):
    p = keyed.port
    status, headers, body = raw(p, f"HEAD / HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nConnection: close\r\n\r\n".encode())
    assert status == 200 and body == b"" and headers["content-type"].startswith("text/html")
    status, _, body = raw(p, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 404 and "endpoints" in json.loads(body)["error"]["message"]
    status, _, body = raw(p, b"DELETE /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 405 and json.loads(body)["error"]["code"] == "http_error"
    status, _, body = raw(p, b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 426 and json.loads(body)["error"]["code"] == "upgrade_required"


def test_private_metrics_need_the_key(keyed):
    p = keyed.port
    status, _, body = raw(p, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 401 and b"--private-metrics" in body
    auth = b"Authorization: Bearer " + KEY.encode("utf-8")
    status, _, body = raw(p, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\nConnection: close\r\n\r\n")
    assert status == 200 and b"speechrt_sessions_active" in body
    status, _, body = raw(p, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    status, _, body = raw(p, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\nConnection: close\r\n\r\n")
    health = json.loads(body)
    assert health["models"]["asr"] == ["whisper-tiny.en"] and "runners" in health


def test_a_port_in_use_or_out_of_range_is_said_before_the_models_load():
    """`speechrt serve` on a port another socket holds, or outside 0-65535: a one-line error and exit code 2
    before the models load (it printed 'models loaded' after them), no traceback."""
    import subprocess
    import sys

    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        for args, says in (
            (["--port", str(port)], f"127.0.0.1:{port} is in use"),
            (["--port", "70000"], "port must be in [0, 65535]"),
        ):
            p = subprocess.run(
                [sys.executable, "-m", "speechrt", "serve", *args], capture_output=True, text=True, timeout=120
            )
            assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr
            assert "models loaded" not in p.stdout, p.stdout
