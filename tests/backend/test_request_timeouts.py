"""Request timeouts on a real uvicorn (``backend.limits.request_timeout_protocol``): a body slower
than the header timeout but at a real rate is served; a trickled body gets 408 and a close."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
from server_helpers import live_server, wav_bytes

from backend.config import ServerConfig

pytestmark = pytest.mark.timeout(60)
BOUNDARY = "b0undary"


def upload_head(address: str, body_length: int) -> bytes:
    return (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {address}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
            f"Content-Length: {body_length}\r\nConnection: close\r\n\r\n").encode()


def upload_body(wav: bytes) -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; "
            "filename=\"a.wav\"\r\n\r\n").encode() + wav + f"\r\n--{BOUNDARY}--\r\n".encode()


def send_paced(address: str, body: bytes, bytes_per_s: float, piece: int) -> bytes:
    """POST ``body`` at ``bytes_per_s`` (``Connection: close``); everything the server sent
    back until it closed the connection."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(upload_head(address, len(body)))
        began = time.monotonic()
        try:
            for offset in range(0, len(body), piece):
                time.sleep(max(0.0, began + offset / bytes_per_s - time.monotonic()))
                sock.sendall(body[offset:offset + piece])
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed by the server: what it sent says why
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received


def test_an_upload_slower_than_the_header_timeout_at_a_real_rate_is_served(
        make_config: Callable[..., ServerConfig]) -> None:
    body = upload_body(wav_bytes(0.5))  # 16 KB at 6 KB/s: 2.7 s, the header timeout is 1 s
    with live_server(make_config(port=0, header_timeout_s=1.0)) as address:
        response = send_paced(address, body, 6000, 1000)
    assert response.startswith(b"HTTP/1.1 200 "), response[:300]


def test_a_trickled_body_gets_408_and_a_close(make_config: Callable[..., ServerConfig]) -> None:
    body = upload_body(wav_bytes(0.5))
    with live_server(make_config(port=0, header_timeout_s=0.5)) as address:
        began = time.monotonic()
        response = send_paced(address, body, 20, 2)  # 20 bytes/s
        waited = time.monotonic() - began
    assert response.startswith(b"HTTP/1.1 408 Request Timeout"), response[:300]
    assert b"too slowly" in response
    assert waited < 2.0, waited  # 0.5 s, plus 1 s per 1,000 bytes received (a few dozen)
