"""API keys: who may use the server when ``ServerConfig.api_keys`` is set.

Every API route and websocket needs ``Authorization: Bearer KEY``; websockets may instead offer
the ``openai-insecure-api-key.KEY`` subprotocol (what OpenAI's browser clients send, since a
page cannot set headers on a websocket). ``/healthz`` and ``/readyz`` stay open for load
balancers, and the page's static files hold no data, so they stay open too.

A key can be exchanged at ``POST /api/token`` for a short-lived token (``TokenStore``) that is
accepted wherever a key is: the demo page asks its user for the key once and only ever puts
tokens into websocket handshakes. A token acts for the key that minted it: a stream's resume
token (`backend.resume`) is bound to that key (`Credentials.principal`), not to the page token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
REALTIME_SUBPROTOCOL = "realtime"
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
PROTECTED_PREFIXES = ("/v1/", "/v1", "/api/", "/ws/", "/metrics")
UNAUTHORIZED_CLOSE = 1008


def openai_error(message: str, error_type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class TokenStore:
    """Short-lived bearer tokens minted for holders of a key.

    Only touched from the event loop's thread. Expired tokens are dropped whenever one is
    minted, so the store holds at most the tokens of the last ``ttl_s`` seconds.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._owner: dict[str, str | None] = {}  # token -> the principal that minted it

    def mint(self, owner: str | None = None) -> tuple[str, float]:
        """A new token acting for ``owner`` (a `Credentials.principal`) and its expiry
        (seconds since the epoch)."""
        now = self._clock()
        self._expiry = {t: e for t, e in self._expiry.items() if e > now}
        self._owner = {t: self._owner.get(t) for t in self._expiry}
        token = "oasr-tmp-" + secrets.token_urlsafe(24)
        self._expiry[token] = now + self.ttl_s
        self._owner[token] = owner
        return token, self._expiry[token]

    def is_valid(self, token: str) -> bool:
        expiry = self._expiry.get(token)
        return expiry is not None and expiry > self._clock()

    def owner(self, token: str) -> str | None:
        """The principal a valid token acts for (None: unknown or expired)."""
        return self._owner.get(token) if self.is_valid(token) else None


class Credentials:
    """The keys a server accepts plus the tokens it minted."""

    def __init__(self, keys: tuple[str, ...], tokens: TokenStore) -> None:
        self.keys = keys
        self.tokens = tokens

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def is_valid(self, secret: str | None) -> bool:
        if not self.enabled:
            return True
        if not secret:
            return False
        # compare against every key, in constant time per key
        matched = [hmac.compare_digest(secret.encode(), key.encode()) for key in self.keys]
        return any(matched) or self.tokens.is_valid(secret)

    def principal(self, secret: str | None) -> str | None:
        """Who ``secret`` (a valid key or minted token) acts for: a digest of the key (a token
        acts for the key that minted it); None when no keys are configured."""
        if not self.enabled or not secret:
            return None
        if self.is_key(secret):
            return "key:" + hashlib.sha256(secret.encode()).hexdigest()[:32]
        return self.tokens.owner(secret)

    def is_key(self, secret: str | None) -> bool:
        """A configured key (not a minted token): only keys may mint tokens."""
        return bool(secret) and any(
            hmac.compare_digest(str(secret).encode(), key.encode()) for key in self.keys)


def bearer_secret(headers: Headers) -> str | None:
    """The ``KEY`` of ``Authorization: Bearer KEY``, or None."""
    scheme, _, secret = headers.get("authorization", "").partition(" ")
    return secret.strip() or None if scheme.lower() == "bearer" else None


def offered_subprotocols(headers: Headers) -> list[str]:
    return [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def websocket_secret(headers: Headers) -> str | None:
    """The key or token a websocket handshake authenticates with (header, then
    subprotocol)."""
    return bearer_secret(headers) or subprotocol_secret(headers)


def subprotocol_secret(headers: Headers) -> str | None:
    """The key of an ``openai-insecure-api-key.KEY`` subprotocol, or None."""
    for protocol in offered_subprotocols(headers):
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX):
            return protocol[len(KEY_SUBPROTOCOL_PREFIX):]
    return None


def accepted_subprotocol(websocket: WebSocket) -> str | None:
    """The subprotocol to answer a handshake with (a browser fails one left unanswered):
    ``realtime`` when offered, else the key subprotocol the client offered, else None."""
    offered = offered_subprotocols(websocket.headers)
    if REALTIME_SUBPROTOCOL in offered:
        return REALTIME_SUBPROTOCOL
    return next((p for p in offered if p.startswith(KEY_SUBPROTOCOL_PREFIX)), None)


def is_protected(path: str) -> bool:
    return path not in OPEN_PATHS and path.startswith(PROTECTED_PREFIXES)


class ApiKeyMiddleware:
    """Refuses unauthenticated requests: 401 with OpenAI's error body over HTTP; over a
    websocket, the handshake is accepted so that an error message can say why, then closed
    with 1008 (policy violation)."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] not in ("http", "websocket") or not self.credentials.enabled
                or not is_protected(scope["path"])):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        secret = bearer_secret(headers)
        if scope["type"] == "websocket" and secret is None:
            secret = subprotocol_secret(headers)
        if self.credentials.is_valid(secret):
            await self.app(scope, receive, send)
            return
        why = ("no API key: send 'Authorization: Bearer KEY'" if secret is None
               else "incorrect API key provided")
        body = openai_error(why, code="invalid_api_key")
        if scope["type"] == "http":
            await JSONResponse(body, status_code=401)(scope, receive, send)
            return
        websocket = WebSocket(scope, receive, send)
        await websocket.accept(subprotocol=accepted_subprotocol(websocket))
        if scope["path"].startswith("/v1"):
            message = {"type": "error", "event_id": "event_" + secrets.token_hex(8), **body}
        else:
            message = {"type": "error", "code": "unauthorized", "message": why}
        await websocket.send_text(json.dumps(message))
        await websocket.close(UNAUTHORIZED_CLOSE, reason="invalid api key")
