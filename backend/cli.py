"""``oasr-server``: the live server's command line (also ``python -m backend``).

Every flag's default is its field's in ``ServerConfig()`` (whose engine is
`backend.config.default_engine_config`): the server's flags are `FieldFlag` rows naming a
`ServerConfig` field (or an `EngineConfig` field the server owns, such as ``--max-wait``), the
engine's come from `oasr.engine.options`, shared with ``oasr transcribe``. A flag left out
leaves its field as ``ServerConfig()`` has it. ``--help`` lists the flags a deployer sets;
``--help-all`` lists every flag, grouped (docs/configuration.md documents them all).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backend.config import API_KEYS_ENV, LOG_LEVELS, ServerConfig, api_keys_from_env
from backend.server import run
from oasr.engine.options import (
    ENGINE_FLAGS,
    ENGINE_GROUPS,
    Flag,
    add_flags,
    add_groups,
    add_help_all,
    engine_config_from_args,
    field_reader,
)

MIB = 2**20


@dataclass(frozen=True, eq=False)
class FieldFlag(Flag):
    """A flag that sets one field: ``field`` of `ServerConfig`, or with ``engine`` of its
    `EngineConfig`; the field's value is the flag's times ``scale``."""

    field_name: str = ""
    engine: bool = False
    scale: int = 1
    repeat: bool = False  # repeatable: the field is the tuple of the values given

    def __post_init__(self) -> None:
        if self.read is None:
            path = f"engine.{self.field_name}" if self.engine else self.field_name
            read = field_reader(path)
            scale = self.scale
            object.__setattr__(self, "read",
                               read if scale == 1 else (lambda config: read(config) / scale))

    def to_field(self, value: Any) -> Any:
        """The field's value for the flag's ``value``."""
        if self.repeat:
            return tuple(value)
        return int(value * self.scale) if self.scale != 1 else value


SERVER = "server"
STREAMS = "streams and timeouts"
FLOW = "flow control"
PROBES = "drain, probes and metrics"
SERVER_GROUPS = (SERVER, STREAMS, FLOW, PROBES)


def _field(flag: str, name: str, help: str, group: str, *, common: bool = False,
           engine: bool = False, none: str = "none", scale: int = 1, repeat: bool = False,
           default: str | None = None, **kwargs: Any) -> FieldFlag:
    return FieldFlag(flag, help, group, common=common, none=none, default=default,
                     kwargs=kwargs, field_name=name, engine=engine, scale=scale, repeat=repeat)


FIELD_FLAGS: tuple[FieldFlag, ...] = (
    # -- server
    _field("--host", "host", "address to listen on; 0.0.0.0 listens on every interface",
           SERVER, common=True),
    _field("--port", "port", "TCP port to listen on; 0 picks a free one", SERVER, common=True,
           type=int),
    _field("--api-key", "api_keys", "key clients must send as 'Authorization: Bearer KEY' "
           f"(repeatable; also ${API_KEYS_ENV}, comma-separated)", SERVER, common=True,
           repeat=True, none="no keys, no authentication", action="append", metavar="KEY"),
    _field("--allowed-host", "allowed_hosts", "Host header to serve (repeatable; "
           "*.example.com and * work); other Host headers get 400", SERVER, common=True,
           repeat=True, default="localhost, 127.0.0.1, [::1] and the --host address",
           action="append", metavar="NAME"),
    _field("--allowed-origin", "allowed_origins", "websocket Origin to accept (repeatable; * "
           "accepts any)", SERVER, common=True, repeat=True,
           none="the page's own host only", action="append", metavar="ORIGIN"),
    _field("--max-connections", "max_connections", "simultaneous /ws/asr connections; one more "
           "is refused 'busy'", SERVER, common=True, type=int, metavar="N"),
    _field("--max-upload-mb", "max_upload_bytes", "largest POST /v1/audio/transcriptions body, "
           "in MiB", SERVER, common=True, scale=MIB, type=float, metavar="MIB"),
    _field("--max-upload-audio", "max_upload_audio_s", "longest audio an uploaded file may "
           "hold, in seconds (413 beyond it)", SERVER, type=float, metavar="S"),
    _field("--log-level", "log_level", "the server's log level", SERVER, common=True,
           choices=LOG_LEVELS),
    _field("--replica", "replica", "this server's name in /metrics labels, stats and 'ready' "
           "messages; '' leaves the metrics unlabelled", SERVER, default="the host name",
           metavar="NAME"),
    # -- streams and timeouts (EngineConfig fields the server's flags set)
    _field("--max-wait", "max_wait_time_s", "seconds a new stream may wait for a free slot "
           "before it is refused 'busy'", STREAMS, engine=True, type=float, metavar="S"),
    _field("--idle-timeout", "idle_timeout_s", "seconds without audio after which a stream "
           "ends with 'timeout'", STREAMS, common=True, engine=True, type=float, metavar="S"),
    _field("--max-session", "max_session_s", "longest stream, in seconds; then it ends with "
           "'timeout'", STREAMS, engine=True, type=float, metavar="S"),
    _field("--min-audio-rate", "min_audio_rate", "a stream sending less audio than this "
           "fraction of real time over --audio-rate-window ends with 'timeout' (0: never)",
           STREAMS, engine=True, type=float, metavar="FRACTION"),
    _field("--audio-rate-window", "audio_rate_window_s", "the window of --min-audio-rate, in "
           "seconds", STREAMS, engine=True, type=float, metavar="S"),
    _field("--admission-budget", "admission_budget", "admit a new stream only while the "
           "running streams and it would need at most this share of the engine's time (a step's "
           "fixed cost and its cost per second of audio, measured at start-up and from real "
           "steps), so admitted streams stay real time; 0 turns it off", STREAMS, engine=True, type=float,
           none="slots alone decide", metavar="FRACTION"),
    _field("--admission-second-pass-budget", "admission_second_pass_budget", "with "
           "--admission-budget and the second pass on, admit a new stream only while the "
           "running streams and it would also need at most this share of the second pass's "
           "decoders' time (measured over the last 20 s once more than 8 streams run), so "
           "finals keep Whisper's text instead of being given up for lateness", STREAMS,
           engine=True, type=float, none="the step alone bounds admission",
           metavar="FRACTION"),
    _field("--batch-window", "batch_window_s", "seconds a ready chunk may wait for the "
           "streams whose next chunk is due within them, so that they share one step "
           "(scaled by the engine's busy share: none when idle, all of it from half busy); "
           "0: every chunk runs at once", STREAMS, engine=True, type=float, metavar="S"),
    _field("--resume-window", "resume_window_s", "seconds a stream whose client's socket "
           "dropped stays suspended (slot, cache and decoder state kept) for the client to "
           "resume it with its token; then it ends 'abandoned'. 0: no resume", STREAMS,
           type=float, metavar="S"),
    _field("--second-pass-max-backlog", "second_pass_max_backlog", "finals the second pass "
           "may have queued or decoding; beyond it a final keeps its CTC text", STREAMS,
           engine=True, none="--max-decode-slots per second-pass process", type=int,
           metavar="N"),
    _field("--second-pass-fast-backlog", "second_pass_fast_backlog", "once more than this "
           "many finals wait for the second pass, the next are decoded greedy on the segment's "
           "own window instead of beam-searched, so a busy second pass keeps up; 0: every "
           "final greedy", STREAMS, engine=True, type=int, metavar="N"),
    # -- flow control
    _field("--max-frame-bytes", "max_frame_bytes", "largest websocket frame, in bytes (close "
           "1009 beyond it)", FLOW, type=int, metavar="BYTES"),
    _field("--max-socket-audio", "max_socket_audio_s", "seconds of audio one connection may "
           "have queued and not decoded before the server stops reading its socket", FLOW,
           type=float, metavar="S"),
    _field("--max-queued-audio", "max_queued_audio_s", "seconds of audio all connections "
           "together may have queued; beyond it every connection with audio queued waits",
           FLOW, type=float, metavar="S"),
    _field("--max-json-depth", "max_json_depth", "deepest nesting of a JSON control message",
           FLOW, type=int, metavar="N"),
    _field("--header-timeout", "header_timeout_s", "seconds an HTTP connection has to send its "
           "request headers before it is closed", FLOW, type=float, metavar="S"),
    _field("--ws-ping", "ws_ping_s", "seconds between websocket pings, and to answer one",
           FLOW, type=float, metavar="S"),
    _field("--stats-send-timeout", "stats_send_timeout_s", "seconds a /ws/stats send may take "
           "before that viewer is dropped", FLOW, type=float, metavar="S"),
    _field("--stats-interval", "stats_interval_s", "seconds between /ws/stats pushes and "
           "metrics samples", FLOW, type=float, metavar="S"),
    # -- drain and probes
    _field("--drain-timeout", "drain_timeout_s", "on SIGTERM or SIGINT: seconds live streams "
           "may run on before they end with 'timeout' and the process exits 0", PROBES,
           common=True, type=float, metavar="S"),
    _field("--ready-headroom", "ready_headroom_streams", "/readyz answers 503 unless this many "
           "more streams fit (slots and K/V blocks)", PROBES, type=int, metavar="N"),
    _field("--stuck-after", "stuck_after_s", "/healthz answers 503 when the engine loop has "
           "not come round for this many seconds", PROBES, type=float, metavar="S"),
)


def all_flags() -> tuple[Flag, ...]:
    """Every ``oasr-server`` flag: the server's, then the engine's."""
    return (*FIELD_FLAGS, *ENGINE_FLAGS)


def build_parser() -> argparse.ArgumentParser:
    """``oasr-server``'s flags: the server's groups, then the engine's."""
    defaults = ServerConfig()
    parser = argparse.ArgumentParser(
        prog="oasr-server", description="oasr: streaming speech recognition server (the live "
        "demo page, /ws/asr, the OpenAI-compatible /v1 APIs)",
        epilog="Every flag: oasr-server --help-all, and docs/configuration.md.")
    add_help_all(parser)
    add_flags(parser, FIELD_FLAGS, defaults, add_groups(parser, SERVER_GROUPS))
    add_flags(parser, ENGINE_FLAGS, defaults.engine, add_groups(parser, ENGINE_GROUPS))
    return parser


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The `ServerConfig` (and its engine's config) that ``oasr-server``'s flags describe:
    ``ServerConfig()`` with the fields of the flags given.

    Raises:
        ValueError: a value out of range (the config's message names it).
    """
    given = {f: getattr(args, f.dest) for f in FIELD_FLAGS if getattr(args, f.dest) is not None}
    server = {f.field_name: f.to_field(v) for f, v in given.items() if not f.engine}
    engine = {f.field_name: f.to_field(v) for f, v in given.items() if f.engine}
    env_keys = api_keys_from_env()
    if env_keys:
        server["api_keys"] = (*server.get("api_keys", ()), *env_keys)
    defaults = ServerConfig()
    return ServerConfig(**server,
                        engine=engine_config_from_args(args, base=defaults.engine, **engine))


def server_main(argv: Sequence[str] | None = None) -> int:
    """``oasr-server``: the live demo (Starlette + uvicorn) with the engine on its own thread."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = server_config_from_args(args)
    except ValueError as exc:  # a knob out of range: say which, like argparse does
        parser.error(str(exc))
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    return run(config)


if __name__ == "__main__":
    sys.exit(server_main())
