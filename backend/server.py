"""Run the app under uvicorn: drain on SIGTERM / SIGINT, exit non-zero if the engine dies.

``run(config)`` serves until a signal ends a drain (exit status 0), a second signal cuts it
short, or the engine thread dies: then every client has been told (an error and a close) and
the process exits with status 1, so a supervisor (``restart: unless-stopped``, Kubernetes)
starts a fresh one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
from types import FrameType

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from backend.app import AppContext, create_app
from backend.config import ServerConfig
from backend.keepalive import BackpressureKeepaliveProtocol
from backend.limits import request_timeout_protocol
from oasr.engine import EngineThread, configure_process, freeze_startup_objects
from oasr.engine.events import FinishReason

# uvicorn's own frame limit sits above ours so that an oversized frame gets the protocol's
# too_large error (close 1009) with a message, not a bare close from the transport.
TRANSPORT_SIZE_FACTOR = 4
ENGINE_WATCH_S = 0.25
EXIT_ENGINE_DIED = 1
EXIT_BAD_CONFIG = 2
logger = logging.getLogger(__name__)


def build_uvicorn_config(config: ServerConfig,
                         engine: EngineThread | None = None) -> uvicorn.Config:
    """The uvicorn configuration serving ``create_app(config, engine)``.

    HTTP timeouts: a connection must complete a request's headers within
    ``config.header_timeout_s`` and its body as long after them, plus 1 s per
    ``MIN_BODY_BYTES_PER_S`` bytes received (uvicorn has no such limits), an idle keep-alive
    connection is closed after 5 s (uvicorn's ``timeout_keep_alive``), websockets are pinged
    every ``config.ws_ping_s`` and closed when a ping goes unanswered for as long while the
    server reads the socket (`backend.keepalive`: backpressure does not count).
    """
    return uvicorn.Config(
        create_app(config, engine),
        host=config.host,
        port=config.port,
        http=request_timeout_protocol(AutoHTTPProtocol, config.header_timeout_s),
        ws=BackpressureKeepaliveProtocol,
        ws_max_size=TRANSPORT_SIZE_FACTOR * max(config.max_frame_bytes, config.max_text_bytes),
        ws_ping_interval=config.ws_ping_s,
        ws_ping_timeout=config.ws_ping_s,
        timeout_keep_alive=5,
        lifespan="on",
        log_level="info",
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first SIGTERM / SIGINT starts a drain (`backend.drain`) instead
    of cutting every session; a second SIGINT falls through to uvicorn's immediate shutdown."""

    def __init__(self, config: uvicorn.Config, context: AppContext) -> None:
        super().__init__(config)
        self.context = context
        self.exit_code = 0
        self.signal_loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First SIGTERM / SIGINT: drain. Later SIGTERMs are ignored (a Kubernetes preStop
        hook starts the drain, then the kubelet sends its own SIGTERM); a later SIGINT (Ctrl+C
        again) shuts down at once."""
        if self.signal_loop is None or self.should_exit:
            super().handle_exit(sig, frame)
        elif not self.context.drain.is_draining:
            self.signal_loop.call_soon_threadsafe(self._begin_drain, signal.Signals(sig).name)
        elif sig == signal.SIGINT:
            super().handle_exit(sig, frame)  # shut down now: sessions are cut (close 1012)

    def _begin_drain(self, why: str) -> None:
        context = self.context
        if not context.drain.begin():
            return
        print(f"oasr: {why}: draining for up to {context.config.drain_timeout_s:g} s "
              "(Ctrl+C again to stop now)", file=sys.stderr, flush=True)
        asr = context.limiters["/ws/asr"]

        def end_all_streams() -> None:
            if context.engine is not None:
                context.engine.finish_all(
                    FinishReason.TIMEOUT, "the server is shutting down (drain timeout)")

        async def drain_then_exit() -> None:
            await context.drain.run(lambda: asr.num_connections, end_all_streams)
            self.should_exit = True

        task = asyncio.ensure_future(drain_then_exit())
        self._tasks.add(task)

    async def watch_engine(self) -> None:
        """Exit (status 1) once the engine thread has died and its clients were told."""
        while not self.should_exit:
            engine = self.context.engine
            if engine is not None and engine.error is not None:
                logger.error("the engine thread died (%r): exiting with status %d so that a "
                             "supervisor restarts the server", engine.error, EXIT_ENGINE_DIED)
                self.exit_code = EXIT_ENGINE_DIED
                await asyncio.sleep(1.0)  # the errors and closes reach the clients
                self.should_exit = True
                return
            await asyncio.sleep(ENGINE_WATCH_S)


def run(config: ServerConfig) -> int:
    """Serve until drained or interrupted; prints the URL to open once the engine is ready.

    Returns:
        The process exit status: 0 after a drain, 1 if the engine thread died, 2 if the
        engine refused its configuration (a pool too small for its slots, ...).
    """
    print(f"oasr: loading the model on {config.engine.device}; the demo will be at {config.url}",
          file=sys.stderr, flush=True)
    configure_process(config.engine.resolved_num_threads)  # once, before the engine's first tensor
    try:  # before uvicorn: a refused configuration is one clear line, not a lifespan traceback
        engine = EngineThread(config.engine,
                              calibrate=bool(config.engine.admission_budget))
    except ValueError as exc:
        print(f"oasr-server: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    uvicorn_config = build_uvicorn_config(config, engine)
    freeze_startup_objects()  # the model, tables and imports: out of the collector's scans
    context = uvicorn_config.app.state.context  # type: ignore[union-attr]
    server = DrainingServer(uvicorn_config, context)
    try:
        asyncio.run(_serve(server, config))
    except KeyboardInterrupt:  # a second Ctrl+C: uvicorn already shut the app down
        print("oasr: stopped", file=sys.stderr)
    return server.exit_code


async def _serve(server: DrainingServer, config: ServerConfig) -> None:
    server.signal_loop = asyncio.get_running_loop()  # signals arrive on this loop
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.1)
    engine = server.context.engine
    while (server.started and not serving.done() and engine is not None and not engine.ready
           and engine.error is None and engine.is_alive()):
        await asyncio.sleep(0.05)  # the step's calibration: a socket before it is refused busy
    watcher = None
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1] if config.port == 0 else config.port
        url = dataclasses.replace(config, port=port).url
        if engine is None or engine.ready:
            print(f"\n  oasr is ready: open {url} and press the mic button\n", flush=True)
        watcher = asyncio.create_task(server.watch_engine())
    await serving
    if watcher is not None:
        watcher.cancel()
