"""Helpers shared by the backend tests: tiny models, PCM, waiting on the engine."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import uvicorn
from support.paths import REPO_ROOT

from backend.config import ServerConfig
from backend.server import build_uvicorn_config
from oasr.decoding import EndpointConfig, EndpointRule

DEFAULT_MODEL_DIR = REPO_ROOT / "oasr" / "assets" / "default_model"
# a segment ends every 1.28 s of audio (two 640 ms chunks), whatever was said: finals (and
# server VAD's turns) without speech or pauses
EVERY_SECOND = EndpointConfig(rule1=None, rule2=None, rule4=None, max_cut_window_s=0.0,
                              rule3=EndpointRule(must_contain_speech=False,
                                                 min_trailing_silence_s=0.0,
                                                 min_utterance_length_s=1.0))
CHAR_UNITS = ["<blank>", "<unk>", "\u2581", *"abcdefghijklmnopqrstuvwxyz'", "<sos/eos>"]


def synthetic_pcm(seconds: float, sample_rate: int = 16000, seed: int = 0) -> bytes:
    """Deterministic speech-like s16le: a wobbling tone plus noise, ``seconds`` long."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    tone = np.sin(2 * np.pi * (180 + 60 * np.sin(2 * np.pi * 3 * t)) * t)
    signal = 0.3 * tone + 0.05 * rng.standard_normal(t.size)
    return (signal * 32767 * 0.8).astype("<i2").tobytes()


def frames(pcm: bytes, frame_bytes: int = 3200) -> list[bytes]:
    """Cut PCM into websocket frames (3,200 bytes = 100 ms of 16 kHz s16le)."""
    return [pcm[i:i + frame_bytes] for i in range(0, len(pcm), frame_bytes)]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0,
               what: str = "condition") -> None:
    """Poll ``predicate`` every 20 ms; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


@contextmanager
def engine_held(client: Any) -> Iterator[None]:
    """Within the block every step of ``client``'s engine thread waits (up to 30 s) to run:
    the engine decodes nothing, ends no stream and sends no event until the block ends."""
    engine = client.app.state.context.engine
    release = threading.Event()
    step = engine.engine.step

    def held_step() -> bool:
        release.wait(30)
        return step()

    engine.engine.step = held_step
    try:
        yield
    finally:
        release.set()
        engine.engine.step = step


@contextmanager
def live_server(config: ServerConfig) -> Iterator[str]:
    """Serve ``config`` on a free port in a background thread; yields ``host:port``."""
    server = uvicorn.Server(build_uvicorn_config(config))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 120, "uvicorn startup")
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()


def get_stats(address: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{address}/api/stats", timeout=5) as response:
        return json.loads(response.read())


def wav_bytes(seconds: float, sample_rate: int = 16000, seed: int = 0) -> bytes:
    """``synthetic_pcm`` as a 16-bit wav file."""
    import io

    import soundfile as sf

    samples = np.frombuffer(synthetic_pcm(seconds, sample_rate, seed), dtype="<i2")
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def pool_is_full(stats: dict[str, Any]) -> bool:
    """Every block free and no stream active or waiting."""
    pool, streams = stats["pool"], stats["streams"]
    return (pool["num_used_blocks"] == 0 and pool["num_free_blocks"] == pool["num_blocks"]
            and streams["active"] == 0 and streams["waiting"] == 0)
