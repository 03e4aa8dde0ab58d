"""The Starlette app: websockets, OpenAI's transcription APIs, stats, metrics, health checks and
the page itself, behind the allowed-hosts check and (when keys are set) API keys.

``create_app(config, engine=None)`` builds the app. The lifespan builds the engine thread from
``config.engine`` when none is given, starts it (unless it is already running)
and the stats hub, and on shutdown stops what it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from backend import openai_http
from backend.admission import ConnectionLimiter, is_origin_allowed
from backend.asr_socket import AsrConnection, StreamState
from backend.auth import (
    ApiKeyMiddleware,
    Credentials,
    TokenStore,
    accepted_subprotocol,
    bearer_secret,
    openai_error,
    websocket_secret,
)
from backend.config import ServerConfig
from backend.drain import Drain
from backend.health import liveness, readiness
from backend.limits import AudioFlowGate
from backend.openai_realtime import RealtimeConnection
from backend.prometheus import ServerMetrics
from backend.protocol import CloseCode, ProtocolError, Session
from backend.realtime_session import RealtimeError
from backend.resume import ResumeError, ResumeRegistry
from backend.stats import ServedSnapshot, ServerSnapshot, StatsHub, stream_stats
from oasr.engine import EngineThread
from oasr.engine.snapshot import EngineSnapshot

ASR_ENDPOINT = "/ws/asr"
STATS_ENDPOINT = "/ws/stats"
REALTIME_ENDPOINT = "/v1/realtime"


class AppContext:
    """Everything the handlers share; one per app (no module-level state)."""

    def __init__(self, config: ServerConfig, engine: EngineThread | None) -> None:
        self.config = config
        self.engine = engine
        self.owns_engine = False  # the lifespan started it, so the lifespan stops it
        self.started_at = time.time()
        self.credentials = Credentials(config.api_keys, TokenStore(config.token_ttl_s))
        self.resumes: ResumeRegistry[StreamState] = ResumeRegistry(config.resume_window_s)
        self.realtime_resumes: ResumeRegistry[RealtimeConnection] = ResumeRegistry(
            config.resume_window_s)
        self.realtime_sessions: set[RealtimeConnection] = set()  # live, with or without socket
        # One limit per websocket endpoint, each of max_connections.
        self.limiters = {endpoint: ConnectionLimiter(config.max_connections)
                         for endpoint in (ASR_ENDPOINT, STATS_ENDPOINT, REALTIME_ENDPOINT)}
        self.metrics = ServerMetrics(self.engine_stats, config.replica)
        self.hub = StatsHub(self.snapshot, self.metrics, config.stats_interval_s,
                            config.stats_send_timeout_s)
        self.drain = Drain(config.drain_timeout_s)
        self.flow = AudioFlowGate(self._queued_audio_s, config.max_socket_audio_s,
                                  config.max_queued_audio_s, self._two_chunks_s)

    @property
    def is_ready(self) -> bool:
        """The engine runs (admission is open); `readiness` adds capacity and draining."""
        return self.engine is not None and self.engine.ready and self.engine.is_alive()

    def _queued_audio_s(self, stream_id: int) -> float:
        return 0.0 if self.engine is None else self.engine.queued_audio_s(stream_id)

    def _two_chunks_s(self) -> float:
        """Audio the engine may need for a stream's next chunk, with its look-ahead."""
        if self.engine is None:
            return 1.0
        resources = self.engine.engine.resources
        return 2 * resources.chunk_size * resources.family.timing.frame_shift_s

    def engine_stats(self) -> EngineSnapshot | None:
        """The engine's latest snapshot; None before the engine is built."""
        return None if self.engine is None else self.engine.stats()

    def snapshot(self) -> ServedSnapshot | None:
        """The engine's stats plus the server's own connection counts."""
        stats = self.engine_stats()
        if stats is None:
            return None
        asr, viewers = self.limiters[ASR_ENDPOINT], self.limiters[STATS_ENDPOINT]
        return ServedSnapshot(stats, ServerSnapshot(
            connections=asr.num_connections,
            max_connections=asr.max_connections,
            realtime_connections=self.limiters[REALTIME_ENDPOINT].num_connections,
            stats_viewers=viewers.num_connections,
            replica=self.config.replica,
            draining=self.drain.is_draining,
            drain_seconds_left=self.drain.seconds_left(),
            queued_audio_s=round(self.flow.total_queued_s, 2),
            num_flow_pauses=self.flow.num_pauses,
        ))


def create_app(config: ServerConfig, engine: EngineThread | None = None) -> Starlette:
    """Build the server's ASGI app.

    Args:
        config: limits, static files and the engine configuration.
        engine: an engine thread to serve (started by the lifespan if not running yet);
            None builds one from ``config.engine`` at startup.
    Returns:
        The Starlette app; ``app.state.context`` is its ``AppContext``.
    """
    if not (config.static_dir / "index.html").is_file():
        raise ValueError(
            f"no index.html in static_dir {config.static_dir}; set ServerConfig.static_dir or "
            "$OASR_FRONTEND_DIR to the frontend folder")
    context = AppContext(config, engine)
    routes = [
        WebSocketRoute(ASR_ENDPOINT, _asr_endpoint),
        WebSocketRoute(STATS_ENDPOINT, _stats_endpoint),
        WebSocketRoute(REALTIME_ENDPOINT, _realtime_endpoint),
        Route("/v1/audio/transcriptions", openai_http.transcriptions, methods=["POST"]),
        Route("/v1/models", openai_http.models),
        Route("/api/token", _api_token, methods=["POST"]),
        Route("/api/stats", _api_stats),
        Route("/metrics", _metrics),
        Route("/healthz", _healthz),
        Route("/readyz", _readyz),
        Mount("/", StaticFiles(directory=config.static_dir, html=True), name="frontend"),
    ]
    middleware = [
        Middleware(ProbeExemptHosts, allowed_hosts=list(config.allowed_hosts)),
        Middleware(ApiKeyMiddleware, credentials=context.credentials),
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=_lifespan)
    app.state.context = context
    return app


PROBE_PATHS = ("/healthz", "/readyz")


class ProbeExemptHosts(TrustedHostMiddleware):
    """Starlette's Host check on every route but the health probes: a load balancer's or
    kubelet's check (HAProxy's ``httpchk`` sends no Host; kubelet sends the pod's IP) must
    reach ``/healthz`` and ``/readyz``, which reveal nothing a rebinding page could use."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    context: AppContext = app.state.context
    if context.engine is None:
        context.engine = await asyncio.to_thread(EngineThread, context.config.engine)
    if not context.engine.is_alive():
        context.engine.start()
        context.owns_engine = True
    hub_task = asyncio.create_task(context.hub.run())
    try:
        yield
    finally:
        hub_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hub_task
        sessions = [s.task for s in context.realtime_sessions if s.task is not None]
        for task in sessions:  # sessions waiting for a resume: the server stops
            task.cancel()
        await asyncio.gather(*sessions, return_exceptions=True)
        if context.owns_engine:
            await asyncio.to_thread(context.engine.stop)


def _context(scope_holder: Request | WebSocket) -> AppContext:
    return scope_holder.app.state.context


async def _admit(websocket: WebSocket, context: AppContext, endpoint: str) -> bool:
    """Accept the handshake if the origin, readiness and the connection limit allow it."""
    origin = websocket.headers.get("origin")
    if not is_origin_allowed(origin, websocket.headers.get("host"),
                             context.config.allowed_origins):
        context.metrics.rejected.labels(reason="origin").inc()
        await websocket.close(code=CloseCode.POLICY_VIOLATION)  # before accept: HTTP 403
        return False
    await websocket.accept(subprotocol=accepted_subprotocol(websocket))
    limiter = context.limiters[endpoint]
    refusal = None
    if endpoint == ASR_ENDPOINT and context.drain.is_draining:
        refusal = ("draining", ProtocolError(
            "draining", "this server is shutting down; connect again (another replica)"))
    elif not context.is_ready:
        refusal = ("not_ready", ProtocolError("busy", "the engine is not ready yet"))
    elif not limiter.try_acquire():
        refusal = ("max_connections", ProtocolError(
            "busy", f"all {limiter.max_connections} {endpoint} connections are in use"))
    if refusal is None:
        return True
    reason, error = refusal
    context.metrics.rejected.labels(reason=reason).inc()
    await websocket.send_json(error.to_json())
    await websocket.close(code=error.close_code)
    return False


async def _serve_socket(websocket: WebSocket, endpoint: str,
                        handler: Callable[[AppContext], Awaitable[None]]) -> None:
    """Admit the connection, count it while ``handler`` runs, release its place after."""
    context = _context(websocket)
    if not await _admit(websocket, context, endpoint):
        return
    gauge = context.metrics.connections.labels(endpoint=endpoint)
    gauge.inc()
    try:
        await handler(context)
    finally:
        gauge.dec()
        context.limiters[endpoint].release()


async def _asr_endpoint(websocket: WebSocket) -> None:
    async def handle(context: AppContext) -> None:
        assert context.engine is not None  # _admit refuses until the engine is ready
        config = context.config
        session = Session(config.max_frame_bytes, config.max_text_bytes, config.max_json_depth)
        principal = context.credentials.principal(websocket_secret(websocket.headers))
        await AsrConnection(websocket, context.engine, session,
                            config.engine.idle_timeout_s, flow=context.flow,
                            replica=config.replica, resumes=context.resumes,
                            principal=principal).run()

    await _serve_socket(websocket, ASR_ENDPOINT, handle)


async def _realtime_endpoint(websocket: WebSocket) -> None:
    async def handle(context: AppContext) -> None:
        assert context.engine is not None  # _admit refuses until the engine is ready
        principal = context.credentials.principal(websocket_secret(websocket.headers))
        token = websocket.query_params.get("resume")
        if token is not None:
            await _resume_realtime(websocket, context, token, principal)
            return
        session = RealtimeConnection(websocket, context.engine, context.config,
                                     resumes=context.realtime_resumes, principal=principal,
                                     flow=context.flow)
        context.realtime_sessions.add(session)
        try:
            await session.run()
        finally:
            if session.task is None or session.task.done():
                context.realtime_sessions.discard(session)
            else:  # away, waiting for a resume
                session.task.add_done_callback(
                    lambda _: context.realtime_sessions.discard(session))

    await _serve_socket(websocket, REALTIME_ENDPOINT, handle)


async def _resume_realtime(websocket: WebSocket, context: AppContext, token: str,
                           principal: str | None) -> None:
    """``/v1/realtime?resume=TOKEN``: take over the session of the token, or an error event
    (``resume_invalid`` / ``resume_expired``) and close 1008."""
    try:
        if not context.realtime_resumes.enabled:
            raise ResumeError("resume_invalid", "this server does not resume sessions (its "
                              "--resume-window is 0)")
        session = context.realtime_resumes.claim(token, principal)
    except ResumeError as exc:
        error = RealtimeError(exc.message, "resume", code=exc.code)
        await websocket.send_json({"type": "error", "event_id": "event_" + secrets.token_hex(8),
                                   "error": error.to_error()})
        await websocket.close(CloseCode.POLICY_VIOLATION)
        return
    await session.resume(websocket, websocket.query_params.get("last_event_id"))


async def _stats_endpoint(websocket: WebSocket) -> None:
    async def handle(context: AppContext) -> None:
        await stream_stats(websocket, context.hub, context.snapshot())

    await _serve_socket(websocket, STATS_ENDPOINT, handle)


async def _api_stats(request: Request) -> Response:
    snapshot = _context(request).snapshot()
    if snapshot is None:
        return JSONResponse({"error": "the engine is not running"}, status_code=503)
    return JSONResponse(snapshot.to_json())


async def _api_token(request: Request) -> Response:
    """A short-lived token for the page's websockets, for the holder of a key. Without keys
    configured there is nothing to prove: ``{"token": null}``."""
    credentials = _context(request).credentials
    if not credentials.enabled:
        return JSONResponse({"token": None, "expires_at": None})
    secret = bearer_secret(request.headers)
    if not credentials.is_key(secret):  # a token cannot mint tokens
        return JSONResponse(openai_error("a token is minted for an API key only",
                                         code="invalid_api_key"), status_code=401)
    token, expires_at = credentials.tokens.mint(owner=credentials.principal(secret))
    return JSONResponse({"token": token, "expires_at": int(expires_at)})


async def _metrics(request: Request) -> Response:
    return Response(_context(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def _healthz(request: Request) -> Response:
    context = _context(request)
    verdict = liveness(context.engine, context.config.stuck_after_s)
    return PlainTextResponse(f"{verdict.reason}\n", status_code=verdict.status_code)


async def _readyz(request: Request) -> Response:
    context = _context(request)
    verdict = readiness(context.engine, context.drain.is_draining, context.engine_stats(),
                        context.config.ready_headroom_streams)
    text = "ready\n" if verdict.ok else f"not ready: {verdict.reason}\n"
    return PlainTextResponse(text, status_code=verdict.status_code)
