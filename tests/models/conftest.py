"""Shared fixtures for model tests: the WeNet reference model and its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from oasr.models import AsrModel, ConformerConfig

# The CI box has 2 shared cores: one intra-op thread avoids oversubscription stalls.
torch.set_num_threads(1)

FIXTURE_DIR = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "wenet"
if not FIXTURE_DIR.is_dir():
    FIXTURE_DIR = Path("/work/shared/fixtures/wenet")


def fixture_config() -> ConformerConfig:
    meta = json.loads((FIXTURE_DIR / "config.json").read_text())
    return ConformerConfig(
        input_dim=meta["input_dim"], vocab_size=meta["output_dim"], **meta["encoder_conf"]
    )


def fixture_state_dict() -> dict[str, torch.Tensor]:
    state = torch.load(FIXTURE_DIR / "state_dict_fp16.pt", weights_only=True)
    return {k: v.float() for k, v in state.items()}


@pytest.fixture(scope="session")
def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURE_DIR / "reference_outputs.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="session")
def wenet_model() -> AsrModel:
    """The fixture's weights in an oasr AsrModel (eval, float32, CPU)."""
    model = AsrModel(fixture_config())
    model.load_state_dict(fixture_state_dict(), strict=True)
    return model.eval()


@pytest.fixture(scope="session")
def feats(reference: dict[str, np.ndarray]) -> torch.Tensor:
    """(1, 512, 80) raw fbank of the reference utterance."""
    return torch.from_numpy(reference["feats"]).unsqueeze(0)
