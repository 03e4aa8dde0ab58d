"""Paths to the shared test audio and WeNet fixtures (``<repo>/../shared``, or $OASR_SHARED)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("OASR_SHARED", Path(__file__).resolve().parents[3] / "shared"))
DEVSET = SHARED / "audio" / "devset"
WENET_FIXTURES = SHARED / "fixtures" / "wenet"


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared test data missing: {path}")
    return path


@pytest.fixture(scope="session")
def devset_wavs() -> list[Path]:
    """The 16 kHz mono devset files."""
    return sorted(_require(DEVSET).glob("*.wav"))


@pytest.fixture(scope="session")
def hello_48k() -> Path:
    return _require(DEVSET / "e2e" / "hello_48k.wav")


@pytest.fixture(scope="session")
def hello_16k() -> Path:
    return _require(DEVSET / "e2e" / "hello_16k.wav")


@pytest.fixture(scope="session")
def wenet_report_path() -> Path:
    """WeNet's measured per-chunk input windows (``trace_chunk<i>.frames``) and offsets."""
    return _require(WENET_FIXTURES / "report.json")


@pytest.fixture(scope="session")
def wenet_reference() -> dict:
    """``wav_int16`` (82160,) int16 and ``feats`` (512, 80) float32 Kaldi fbank."""
    import numpy as np

    with np.load(_require(WENET_FIXTURES / "reference_outputs.npz")) as data:
        return {"wav_int16": data["wav_int16"], "feats": data["feats"]}
