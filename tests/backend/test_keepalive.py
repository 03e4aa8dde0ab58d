"""``backend.keepalive``: a pong's deadline counts the time the server reads the socket only;
a client that answers no ping is still closed."""

from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Callable

import pytest
from server_helpers import live_server

from backend.config import ServerConfig
from backend.keepalive import ReadingClock

pytestmark = pytest.mark.timeout(60)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reading_time_stops_while_the_server_holds_reading() -> None:
    clock = FakeClock()
    reading = ReadingClock(clock)
    reading.start()
    clock.now += 2.0
    reading.hold()  # a message waits for the app: backpressure
    clock.now += 50.0
    assert reading.elapsed() == pytest.approx(2.0)
    reading.release()
    clock.now += 1.5
    assert reading.elapsed() == pytest.approx(3.5)


def test_a_ping_sent_while_reading_is_held_counts_from_the_release() -> None:
    clock = FakeClock()
    reading = ReadingClock(clock)
    reading.hold()
    reading.start()
    clock.now += 30.0
    assert reading.elapsed() == 0.0 and reading.is_held
    reading.release()
    clock.now += 0.25
    assert reading.elapsed() == pytest.approx(0.25)


def test_start_counts_from_zero_again() -> None:
    clock = FakeClock()
    reading = ReadingClock(clock)
    reading.start()
    clock.now += 5.0
    reading.start()
    clock.now += 1.0
    assert reading.elapsed() == pytest.approx(1.0)


def _silent_websocket(address: str) -> socket.socket:
    """A websocket handshake on a raw socket, which will never answer a ping."""
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws/asr HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def test_a_client_that_answers_no_ping_is_closed(
        make_config: Callable[..., ServerConfig]) -> None:
    with live_server(make_config(port=0, ws_ping_s=0.3)) as address:
        sock = _silent_websocket(address)
        began = time.monotonic()
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
        waited = time.monotonic() - began
        sock.close()
    # a close frame (0x88) with code 1011 and uvicorn's reason, after one ping and its timeout
    assert b"\x88" in received and b"\x03\xf3keepalive ping timeout" in received, received
    assert waited < 3.0, waited
