"""Run the app under uvicorn and tell the user which URL to open."""

from __future__ import annotations

import asyncio
import dataclasses
import sys

import uvicorn

from backend.app import create_app
from backend.config import ServerConfig

# uvicorn's own frame limit sits above ours so that an oversized frame gets the protocol's
# too_large error (close 1009) with a message, not a bare close from the transport.
TRANSPORT_SIZE_FACTOR = 4
WEBSOCKET_IMPL = "websockets-sansio"


def build_uvicorn_config(config: ServerConfig) -> uvicorn.Config:
    """The uvicorn configuration serving ``create_app(config)``."""
    return uvicorn.Config(
        create_app(config),
        host=config.host,
        port=config.port,
        ws=WEBSOCKET_IMPL,
        ws_max_size=TRANSPORT_SIZE_FACTOR * max(config.max_frame_bytes, config.max_text_bytes),
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
        lifespan="on",
        log_level="info",
    )


def run(config: ServerConfig) -> None:
    """Serve until interrupted; prints the URL to open once the engine is ready."""
    server = uvicorn.Server(build_uvicorn_config(config))
    print(f"oasr: loading the model on {config.engine.device}; the demo will be at {config.url}",
          file=sys.stderr, flush=True)
    try:
        asyncio.run(_serve(server, config))
    except KeyboardInterrupt:  # Ctrl+C: uvicorn already shut the app (and engine) down
        print("oasr: stopped", file=sys.stderr)


async def _serve(server: uvicorn.Server, config: ServerConfig) -> None:
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.1)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1] if config.port == 0 else config.port
        url = dataclasses.replace(config, port=port).url
        print(f"\n  oasr is ready: open {url} and press the mic button\n", flush=True)
    await serving
