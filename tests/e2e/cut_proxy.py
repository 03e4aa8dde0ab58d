"""A TCP proxy on 127.0.0.1 in front of a server, whose connections a test can cut.

``cut(prefix, down_s)`` ends both sides of every connection whose first HTTP request asked for
a path starting with ``prefix`` (a websocket's upgrade) with no websocket close frame (TCP shut
down, then reset), and for ``down_s`` seconds resets new ones at once: what a Wi-Fi blip does
to a page and to the server.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def _reset(sock: socket.socket) -> None:
    """End the connection without a websocket close frame: FIN at once (a pump thread blocked
    in ``recv`` on it would hold a plain close back until its peer sent more), then RST."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class CutProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream`` (``host:port``), a thread per direction."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.num_cut = 0
        self._lock = threading.Lock()
        self._conns: list[tuple[str, socket.socket, socket.socket]] = []
        self._down: dict[str, float] = {}  # path prefix -> refused until (monotonic)
        self._closed = False
        threading.Thread(target=self._accept, name="cut-proxy", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self, prefix: str, down_s: float = 0.0) -> int:
        """Reset the connections to ``prefix``; refuse new ones for ``down_s``. Returns how
        many were cut."""
        with self._lock:
            self._down[prefix] = time.monotonic() + down_s
            victims = [c for c in self._conns if c[0].startswith(prefix)]
            self._conns = [c for c in self._conns if not c[0].startswith(prefix)]
        for _, client, upstream in victims:
            _reset(client)
            _reset(upstream)
        self.num_cut += len(victims)
        return len(victims)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for _, client, upstream in conns:
            _reset(client)
            _reset(upstream)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        try:
            first = client.recv(65536)  # the request line and headers
            path = first.split(b" ", 2)[1].decode("latin-1") if first.count(b" ") >= 2 else ""
            with self._lock:
                down = any(path.startswith(p) and until > time.monotonic()
                           for p, until in self._down.items())
            if down or not first:
                _reset(client)
                return
            upstream = socket.create_connection(self.upstream)
            upstream.sendall(first)
        except OSError:
            _reset(client)
            return
        with self._lock:
            self._conns.append((path, client, upstream))
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
