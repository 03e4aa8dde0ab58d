"""``oasr-server`` flags for the server's limits, drain and probes (README: "Scaling out")."""

from __future__ import annotations

import argparse
from typing import Any

from backend.config import ServerConfig
from oasr.engine.config import EngineConfig


def add_hardening_arguments(parser: argparse.ArgumentParser, defaults: ServerConfig) -> None:
    """Flags for flood control, audio-rate timeouts, drain, readiness and liveness."""
    g = parser.add_argument_group("limits, drain and probes")
    g.add_argument("--max-socket-audio", type=float, default=defaults.max_socket_audio_s,
                   help="seconds of audio one connection may have queued and not decoded "
                   "before the server stops reading its socket (backpressure)")
    g.add_argument("--max-queued-audio", type=float, default=defaults.max_queued_audio_s,
                   help="seconds of audio all connections together may have queued")
    g.add_argument("--max-json-depth", type=int, default=defaults.max_json_depth,
                   help="deepest nesting of a JSON control message")
    g.add_argument("--min-audio-rate", type=float, default=EngineConfig.min_audio_rate,
                   help="a stream sending less audio than this fraction of real time over "
                   "--audio-rate-window seconds ends with 'timeout' (0: never)")
    g.add_argument("--audio-rate-window", type=float, default=EngineConfig.audio_rate_window_s,
                   help="window of --min-audio-rate, in seconds")
    g.add_argument("--second-pass-max-backlog", type=int,
                   default=EngineConfig.second_pass_max_backlog,
                   help="segments the second pass may have queued; beyond it finals keep "
                   "their CTC text")
    g.add_argument("--stats-send-timeout", type=float, default=defaults.stats_send_timeout_s,
                   help="drop a /ws/stats viewer whose send takes longer (it is not reading)")
    g.add_argument("--header-timeout", type=float, default=defaults.header_timeout_s,
                   help="close an HTTP connection that has not sent its request headers "
                   "within this many seconds")
    g.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout_s,
                   help="on SIGTERM/SIGINT: seconds live streams may run on before they end "
                   "with 'timeout' and the process exits 0")
    g.add_argument("--ready-headroom", type=int, default=defaults.ready_headroom_streams,
                   help="/readyz answers 503 unless this many more streams fit (slots and "
                   "K/V blocks)")
    g.add_argument("--stuck-after", type=float, default=defaults.stuck_after_s,
                   help="/healthz answers 503 when the engine loop has not come round for "
                   "this many seconds")
    g.add_argument("--stats-interval", type=float, default=defaults.stats_interval_s,
                   help="seconds between /ws/stats pushes and metrics samples")
    g.add_argument("--replica", default=defaults.replica,
                   help="this server's name in /metrics labels, stats and ready messages")


def hardening_config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The `ServerConfig` fields those flags set."""
    return {
        "max_socket_audio_s": args.max_socket_audio,
        "max_queued_audio_s": args.max_queued_audio,
        "max_json_depth": args.max_json_depth,
        "stats_send_timeout_s": args.stats_send_timeout,
        "header_timeout_s": args.header_timeout,
        "drain_timeout_s": args.drain_timeout,
        "ready_headroom_streams": args.ready_headroom,
        "stuck_after_s": args.stuck_after,
        "replica": args.replica,
        "stats_interval_s": args.stats_interval,
    }
