"""Helpers shared by the backend tests: tiny models, PCM, waiting on the engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
DEVSET_DIR = REPO_ROOT.parent / "shared" / "audio" / "devset"
DEFAULT_MODEL_DIR = REPO_ROOT / "oasr" / "assets" / "default_model"
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
