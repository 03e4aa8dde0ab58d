"""A tiny random Conformer-CTC and helpers to drive an ASREngine synchronously."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support.paths import DEVSET_DIR

from oasr.audio import read_audio
from oasr.engine import EngineConfig
from oasr.models import AsrModel, ConformerConfig, save_model

UNITS = ["<blank>", "<unk>", "'", *"abcdefghijklmnopqrstuvwxyz", "▁", "<sos/eos>"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded random 2-block Conformer saved in oasr's format."""
    torch.manual_seed(0)
    config = ConformerConfig(
        vocab_size=len(UNITS), output_size=32, attention_heads=2, linear_units=64,
        num_blocks=2, cnn_module_kernel=7,
    )
    model = AsrModel(config, units=UNITS).eval()
    return save_model(model, tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture()
def engine_config(tiny_model_dir: Path) -> EngineConfig:
    return EngineConfig(model=str(tiny_model_dir), device="cpu", max_batch_size=4,
                        max_num_blocks=128, max_wait_time_s=math.inf, endpoint=None)


@pytest.fixture(scope="session")
def speech() -> list[np.ndarray]:
    """Four real recordings of different lengths (16 kHz float32)."""
    names = ["tts_00.wav", "tts_01.wav", "real_jfk.wav", "real_george_0.wav"]
    return [read_audio(DEVSET_DIR / n) for n in names]
