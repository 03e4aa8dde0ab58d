"""Paths to the test audio and the WeNet fixture's front-end outputs (``tests/data``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import DEVSET_DIR, WENET_FIXTURE_DIR


@pytest.fixture(scope="session")
def devset_wavs() -> list[Path]:
    """The 16 kHz mono devset files."""
    return sorted(DEVSET_DIR.glob("*.wav"))


@pytest.fixture(scope="session")
def hello_48k() -> Path:
    return DEVSET_DIR / "e2e" / "hello_48k.wav"


@pytest.fixture(scope="session")
def hello_16k() -> Path:
    return DEVSET_DIR / "e2e" / "hello_16k.wav"


@pytest.fixture(scope="session")
def wenet_report_path() -> Path:
    """WeNet's measured per-chunk input windows (``trace_chunk<i>.frames``) and offsets."""
    return WENET_FIXTURE_DIR / "report.json"


@pytest.fixture(scope="session")
def wenet_reference() -> dict:
    """``wav_int16`` (82160,) int16 and ``feats`` (512, 80) float32 Kaldi fbank."""
    import numpy as np

    with np.load(WENET_FIXTURE_DIR / "reference_outputs.npz") as data:
        return {"wav_int16": data["wav_int16"], "feats": data["feats"]}
