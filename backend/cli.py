"""``oasr-server``: the live server's command line (also ``python -m backend``).

Most server flags set one `ServerConfig` field each (a few set an `EngineConfig` field the
server owns, such as ``--max-wait``); they are declared as `FieldFlag` rows, whose default and
type are the field's. The engine's own flags come from `oasr.engine.options`, shared with
``oasr transcribe``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from backend.config import (
    API_KEYS_ENV,
    SERVER_SECOND_PASS_PROCESS,
    SERVER_SECOND_PASS_PROCESSES,
    ServerConfig,
    api_keys_from_env,
)
from backend.server import run
from oasr.engine.options import add_engine_arguments, engine_config_from_args


@dataclass(frozen=True)
class FieldFlag:
    """A flag that sets one config field; its default and type are that field's default's."""

    flag: str
    field: str
    help: str
    engine: bool = False  # an EngineConfig field (ServerConfig.engine), else a ServerConfig one

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


LISTEN_FLAGS = (
    FieldFlag("--host", "host", "address to listen on (0.0.0.0: all)"),
    FieldFlag("--port", "port", "port (0 picks a free one)"),
    FieldFlag("--max-connections", "max_connections",
              "simultaneous /ws/asr connections; more are refused 'busy'"),
    FieldFlag("--max-frame-bytes", "max_frame_bytes", "largest binary websocket frame"),
    FieldFlag("--idle-timeout", "idle_timeout_s",
              "seconds without audio before a stream ends with 'timeout'", engine=True),
    FieldFlag("--max-session", "max_session_s", "longest stream in seconds", engine=True),
)
MAX_WAIT_FLAG = FieldFlag("--max-wait", "max_wait_time_s",
                          "seconds a new stream may wait for a slot before 'busy'", engine=True)
# flood control, audio-rate timeouts, drain, readiness and liveness (README: "Scaling out")
LIMIT_FLAGS = (
    FieldFlag("--max-socket-audio", "max_socket_audio_s",
              "seconds of audio one connection may have queued and not decoded before the "
              "server stops reading its socket (backpressure)"),
    FieldFlag("--max-queued-audio", "max_queued_audio_s",
              "seconds of audio all connections together may have queued"),
    FieldFlag("--max-json-depth", "max_json_depth", "deepest nesting of a JSON control message"),
    FieldFlag("--min-audio-rate", "min_audio_rate",
              "a stream sending less audio than this fraction of real time over "
              "--audio-rate-window seconds ends with 'timeout' (0: never)", engine=True),
    FieldFlag("--audio-rate-window", "audio_rate_window_s",
              "window of --min-audio-rate, in seconds", engine=True),
    FieldFlag("--second-pass-max-backlog", "second_pass_max_backlog",
              "segments the second pass may have queued; beyond it finals keep their CTC text",
              engine=True),
    FieldFlag("--stats-send-timeout", "stats_send_timeout_s",
              "drop a /ws/stats viewer whose send takes longer (it is not reading)"),
    FieldFlag("--header-timeout", "header_timeout_s",
              "close an HTTP connection that has not sent its request headers within this many "
              "seconds"),
    FieldFlag("--drain-timeout", "drain_timeout_s",
              "on SIGTERM/SIGINT: seconds live streams may run on before they end with "
              "'timeout' and the process exits 0"),
    FieldFlag("--ready-headroom", "ready_headroom_streams",
              "/readyz answers 503 unless this many more streams fit (slots and K/V blocks)"),
    FieldFlag("--stuck-after", "stuck_after_s",
              "/healthz answers 503 when the engine loop has not come round for this many "
              "seconds"),
    FieldFlag("--stats-interval", "stats_interval_s",
              "seconds between /ws/stats pushes and metrics samples"),
    FieldFlag("--replica", "replica",
              "this server's name in /metrics labels, stats and ready messages"),
)
FIELD_FLAGS = (*LISTEN_FLAGS, MAX_WAIT_FLAG, *LIMIT_FLAGS)


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: ...)" to every option's help unless the help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and "default" in action.help:
            return action.help
        return super()._get_help_string(action)


def _add_field_flags(group: argparse._ArgumentGroup, flags: Iterable[FieldFlag],
                     defaults: ServerConfig) -> None:
    for f in flags:
        default = getattr(defaults.engine if f.engine else defaults, f.field)
        group.add_argument(f.flag, type=type(default), default=default, help=f.help)


def build_parser() -> argparse.ArgumentParser:
    """``oasr-server``'s flags: the server group, its limits, then the engine's."""
    defaults = ServerConfig()
    parser = argparse.ArgumentParser(prog="oasr-server", description="oasr live transcription demo",
                                     formatter_class=_DefaultsFormatter)
    g = parser.add_argument_group("server")
    _add_field_flags(g, LISTEN_FLAGS, defaults)
    g.add_argument("--allowed-origin", action="append", default=[],
                   help="websocket Origin to accept (repeatable; default: same host only; * any)")
    _add_field_flags(g, [MAX_WAIT_FLAG], defaults)
    _add_field_flags(parser.add_argument_group("limits, drain and probes"), LIMIT_FLAGS, defaults)
    g.add_argument("--api-key", action="append", default=[],
                   help="API key clients must send as 'Authorization: Bearer KEY' (repeatable; "
                   f"also ${API_KEYS_ENV}, comma-separated); default: no keys, no auth")
    g.add_argument("--allowed-host", action="append", default=[],
                   help="Host header to accept (repeatable; *.example.com and * work); "
                   "default: localhost, 127.0.0.1, [::1] and the address the server binds")
    g.add_argument("--max-upload-mb", type=float, default=defaults.max_upload_bytes / 2**20,
                   help="largest POST /v1/audio/transcriptions body, in MiB")
    add_engine_arguments(parser)
    return parser


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The `ServerConfig` (and its engine's config) that ``oasr-server``'s flags describe.

    Raises:
        ValueError: a value out of range (the config's message names it).
    """
    server = {f.field: getattr(args, f.dest) for f in FIELD_FLAGS if not f.engine}
    engine = {f.field: getattr(args, f.dest) for f in FIELD_FLAGS if f.engine}
    # a live server keeps Whisper off its CPU's way: in processes of its own
    process = (SERVER_SECOND_PASS_PROCESS if args.second_pass_process is None
               else args.second_pass_process)
    engine["second_pass_process"] = process
    if args.second_pass_processes is None and process:
        engine["second_pass_processes"] = SERVER_SECOND_PASS_PROCESSES
    return ServerConfig(
        **server,
        allowed_origins=tuple(args.allowed_origin),
        api_keys=(*args.api_key, *api_keys_from_env()),
        allowed_hosts=tuple(args.allowed_host),
        max_upload_bytes=int(args.max_upload_mb * 2**20),
        engine=engine_config_from_args(args, **engine),
    )


def server_main(argv: Sequence[str] | None = None) -> int:
    """``oasr-server``: the live demo (Starlette + uvicorn) with the engine on its own thread."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = server_config_from_args(args)
    except ValueError as exc:  # a knob out of range: say which, like argparse does
        parser.error(str(exc))
    return run(config)


if __name__ == "__main__":
    sys.exit(server_main())
