"""Who may open a websocket: the origin check and the connection limit."""

from __future__ import annotations

from urllib.parse import urlsplit


def is_origin_allowed(origin: str | None, host: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether a websocket handshake's ``Origin`` may connect.

    Args:
        origin: the ``Origin`` header, or None when the client sent none (not a browser).
        host: the request's ``Host`` header (``host:port``).
        allowed: origins accepted besides the server's own; ``"*"`` accepts any.
    Returns:
        True for no Origin, the page's own origin (same host:port), a listed origin or ``*``.
    """
    if origin is None or "*" in allowed:
        return True
    if origin.rstrip("/") in {o.rstrip("/") for o in allowed}:
        return True
    return host is not None and urlsplit(origin).netloc.lower() == host.lower()


class ConnectionLimiter:
    """Counts open connections of one kind against a maximum.

    Only touched from the event loop's thread, so a plain counter is enough.
    """

    def __init__(self, max_connections: int) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections={max_connections}; it must be >= 1")
        self.max_connections = max_connections
        self.num_connections = 0

    def try_acquire(self) -> bool:
        """Take a place; False (and nothing taken) when all ``max_connections`` are in use."""
        if self.num_connections >= self.max_connections:
            return False
        self.num_connections += 1
        return True

    def release(self) -> None:
        assert self.num_connections > 0, "release without a matching try_acquire"
        self.num_connections -= 1
