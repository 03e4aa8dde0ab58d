"""Server configuration: the limits the backend enforces and the engine it builds."""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from oasr.engine import EngineConfig
from oasr.engine.config import BATCH_WINDOW_S
from oasr.engine.options import command_engine_config

FRONTEND_DIR_ENV = "OASR_FRONTEND_DIR"
API_KEYS_ENV = "OASR_API_KEYS"
LOCAL_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]")  # as Starlette parses Host headers
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def default_engine_config() -> EngineConfig:
    """The engine a server runs when none is given: the commands' engine
    (`oasr.engine.options.command_engine_config`: EngineConfig's defaults with the Whisper
    second pass and 8 chunks of history), with a live client's idle timeout (15 s), the
    second pass in processes of its own, below the streaming step's CPU priority (two where
    the machine has two cores or more, else one), admission by latency (new streams are
    admitted while the running ones need at most 0.8 of the engine's time), and the batching
    hold: under load a ready chunk waits up to `BATCH_WINDOW_S` (0.1 s) for the streams due
    within it, so independent speakers share steps."""
    return command_engine_config(idle_timeout_s=15.0, second_pass_process=True,
                                 second_pass_processes=min(2, os.cpu_count() or 1),
                                 admission_budget=0.8, batch_window_s=BATCH_WINDOW_S)


def default_frontend_dir() -> Path:
    """Where the page's static files live.

    ``$OASR_FRONTEND_DIR`` when set (the Docker image sets it), else ``frontend/`` beside the
    ``backend`` package (a source checkout or an editable install).
    """
    env = os.environ.get(FRONTEND_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "frontend"


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``backend.app.create_app`` needs; validated at construction.

    The stream timeouts are the engine's (``engine.idle_timeout_s``, ``engine.max_session_s``):
    the engine ends idle and overlong streams, and the backend reads the same two values for
    what it enforces itself (a client that has not started a stream yet; an OpenAI realtime
    session). Here they must also be > 0 and ordered.

    Attributes:
        host, port: where uvicorn listens.
        max_connections: simultaneous ``/ws/asr`` connections; one more is refused with ``busy``
            (close 1013). Streams beyond the engine's ``max_batch_size`` wait for a slot.
        max_frame_bytes: largest binary frame accepted (close 1009 beyond it). 100 ms of 48 kHz
            f32le is 19,200 bytes.
        max_text_bytes: largest JSON control message accepted (close 1009 beyond it).
        allowed_origins: ``Origin`` values accepted on the websockets. Empty: same host only
            (the Origin's host:port must equal the request's Host). ``("*",)``: any origin.
            A request without an Origin header (not a browser) is always accepted.
        stats_interval_s: how often ``/ws/stats`` pushes a snapshot and the metrics sample it.
        api_keys: keys accepted as ``Authorization: Bearer KEY`` (websockets also take the
            ``openai-insecure-api-key.KEY`` subprotocol). Empty: no authentication.
        allowed_hosts: ``Host`` header names accepted on every route (others get 400, as
            Starlette's ``TrustedHostMiddleware`` answers); ``*.example.com`` wildcards and
            ``"*"`` (any host) work. Empty: ``default_allowed_hosts(host)``.
        max_upload_bytes: largest ``POST /v1/audio/transcriptions`` body (413 beyond it).
        token_ttl_s: lifetime of the short-lived tokens ``POST /api/token`` hands the page.
        static_dir: the frontend's files, served at ``/``.
        engine: the engine's configuration (``default_engine_config()`` when not given); its
            ``idle_timeout_s`` and ``max_session_s`` are the server's stream timeouts.
        max_json_depth: deepest nesting of a JSON control message (checked before parsing).
        max_socket_audio_s: audio one connection may have queued and not decoded before the
            server stops reading its socket (backpressure: TCP pushes back on the client).
        max_queued_audio_s: audio all connections together may have queued; beyond it every
            connection with audio queued waits.
        stats_send_timeout_s: a ``/ws/stats`` viewer whose send does not complete within this
            is dropped (a viewer that never reads cannot hold its place).
        header_timeout_s: an HTTP connection that has not sent a request's headers within
            this is closed (half-open requests); a request body gets the same time, plus
            1 s for every ``limits.MIN_BODY_BYTES_PER_S`` bytes that arrive (slow bodies).
        ws_ping_s: websockets are pinged every this many seconds and closed when a ping's pong
            has not come back within this many seconds of the server reading the socket (time
            the server holds off reading, backpressure, does not count).
        max_upload_audio_s: longest audio a ``POST /v1/audio/transcriptions`` file may hold,
            read from its header before anything is decoded (413 beyond it).
        drain_timeout_s: on SIGTERM / SIGINT, how long live streams may run on before they
            end with "timeout"; then the process exits.
        ready_headroom_streams: ``/readyz`` answers 200 only while this many more streams fit
            (free slots, and free K/V blocks for each to reach its ceiling).
        stuck_after_s: ``/healthz`` answers 503 when the engine loop has not come round for
            this long (a stuck step), as well as when it died.
        replica: this server's name in ``/metrics`` labels, stats and ready messages (the
            host name by default: the pod or container name); "" leaves the metrics unlabelled
            (a server alone).
        log_level: the level of the server's log (one of `LOG_LEVELS`).
        resume_window_s: a stream whose client's socket drops (`backend.resume`) is kept,
            suspended, this long for the client to resume it with its token; then it ends
            "abandoned". 0: no resume (a dropped client's stream is aborted at once).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    max_connections: int = 64
    max_frame_bytes: int = 256 * 1024
    max_text_bytes: int = 4096
    allowed_origins: tuple[str, ...] = ()
    stats_interval_s: float = 0.25
    api_keys: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    max_upload_bytes: int = 25 * 1024 * 1024
    token_ttl_s: float = 60.0
    static_dir: Path = field(default_factory=default_frontend_dir)
    engine: EngineConfig = field(default_factory=default_engine_config)
    max_json_depth: int = 8
    max_socket_audio_s: float = 5.0
    max_queued_audio_s: float = 120.0
    stats_send_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    ws_ping_s: float = 20.0
    max_upload_audio_s: float = 3600.0
    drain_timeout_s: float = 30.0
    ready_headroom_streams: int = 1
    stuck_after_s: float = 60.0
    replica: str = field(default_factory=socket.gethostname)
    log_level: str = "info"
    resume_window_s: float = 30.0

    def __post_init__(self) -> None:
        self._validate_limits()
        self._validate_hardening()

    def _validate_limits(self) -> None:
        if not self.host:
            raise ValueError("host is empty; use 127.0.0.1 for this machine or 0.0.0.0 for all")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is outside 0..65535 (0 picks a free port)")
        if self.max_connections < 1:
            raise ValueError(f"max_connections={self.max_connections}; it must be >= 1")
        if self.max_frame_bytes < 1024:
            raise ValueError(
                f"max_frame_bytes={self.max_frame_bytes} is below 1024; a 100 ms frame of "
                "16 kHz s16le is 3,200 bytes")
        if self.max_text_bytes < 64:
            raise ValueError(f"max_text_bytes={self.max_text_bytes}; it must be >= 64")
        idle_s, session_s = self.engine.idle_timeout_s, self.engine.max_session_s
        if not idle_s > 0:
            raise ValueError(f"idle_timeout_s={idle_s}; it must be > 0 seconds")
        if not session_s >= idle_s:
            raise ValueError(f"max_session_s={session_s} is shorter than idle_timeout_s="
                             f"{idle_s}; raise max_session_s")
        if not 0.01 <= self.stats_interval_s <= 60:
            raise ValueError(f"stats_interval_s={self.stats_interval_s}; use 0.01..60 seconds")
        if isinstance(self.allowed_origins, str):
            raise ValueError("allowed_origins must be a tuple of origins, not one string")
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))
        for name in ("api_keys", "allowed_hosts"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"{name} must be a tuple of strings, not one string")
            object.__setattr__(self, name, tuple(value))
        if any(not key or key != key.strip() or any(c in key for c in " ,")
               for key in self.api_keys):
            raise ValueError("an API key is empty or holds spaces or commas; use printable "
                             "tokens such as the output of `openssl rand -hex 24`")
        if not self.allowed_hosts:
            object.__setattr__(self, "allowed_hosts", default_allowed_hosts(self.host))
        for pattern in self.allowed_hosts:
            if "*" in pattern[1:] or (pattern.startswith("*") and pattern != "*"
                                      and not pattern.startswith("*.")):
                raise ValueError(f"allowed host {pattern!r}: a wildcard must be '*' alone or "
                                 "lead a domain, like '*.example.com'")
        if self.max_upload_bytes < 1024:
            raise ValueError(f"max_upload_bytes={self.max_upload_bytes}; it must be >= 1024")
        if not 1 <= self.token_ttl_s <= 86400:
            raise ValueError(f"token_ttl_s={self.token_ttl_s}; use 1..86400 seconds")
        object.__setattr__(self, "static_dir", Path(self.static_dir))

    def _validate_hardening(self) -> None:
        if not 1 <= self.max_json_depth <= 64:
            raise ValueError(f"max_json_depth={self.max_json_depth}; use 1..64 (a start is 1)")
        if not 0.5 <= self.max_socket_audio_s <= self.max_queued_audio_s:
            raise ValueError(
                f"max_socket_audio_s={self.max_socket_audio_s} must be >= 0.5 s and <= "
                f"max_queued_audio_s={self.max_queued_audio_s}")
        if not math.isfinite(self.max_queued_audio_s):
            raise ValueError(f"max_queued_audio_s={self.max_queued_audio_s}; it must be finite")
        for name in ("stats_send_timeout_s", "header_timeout_s", "stuck_after_s", "ws_ping_s"):
            value = getattr(self, name)
            if not 0.1 <= value <= 3600:
                raise ValueError(f"{name}={value}; use 0.1..3600 seconds")
        if not 1 <= self.max_upload_audio_s <= 86400:
            raise ValueError(f"max_upload_audio_s={self.max_upload_audio_s}; use 1..86400 seconds")
        if not 0 <= self.drain_timeout_s <= 86400:
            raise ValueError(f"drain_timeout_s={self.drain_timeout_s}; use 0..86400 seconds")
        if not 0 <= self.ready_headroom_streams <= self.engine.max_batch_size:
            raise ValueError(
                f"ready_headroom_streams={self.ready_headroom_streams}; use 0..max_batch_size "
                f"({self.engine.max_batch_size})")
        if any(c in self.replica for c in ' "\\\n'):
            raise ValueError(f"replica {self.replica!r} must have no spaces, quotes or "
                             "backslashes (it is a metrics label)")
        if not 0 <= self.resume_window_s <= 3600:
            raise ValueError(f"resume_window_s={self.resume_window_s}; use 0..3600 seconds "
                             "(0: no resume)")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level {self.log_level!r}: use one of {', '.join(LOG_LEVELS)}")

    @property
    def requires_auth(self) -> bool:
        return bool(self.api_keys)

    @property
    def url(self) -> str:
        """The address to open in a browser (``localhost`` when listening on every interface)."""
        host = "localhost" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/"


def default_allowed_hosts(bind_host: str) -> tuple[str, ...]:
    """The localhost names plus the address the server listens on (when it is one address)."""
    if bind_host in ("0.0.0.0", "::", "", "::1", *LOCAL_HOST_NAMES):
        return LOCAL_HOST_NAMES
    return (*LOCAL_HOST_NAMES, f"[{bind_host}]" if ":" in bind_host else bind_host)


def api_keys_from_env(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Keys from ``$OASR_API_KEYS`` (comma- or whitespace-separated); () when unset."""
    value = (os.environ if environ is None else environ).get(API_KEYS_ENV, "")
    return tuple(key for key in value.replace(",", " ").split() if key)
