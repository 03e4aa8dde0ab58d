"""Fixtures for cache tests: tiny CPU pools (see cache_helpers) and the WeNet reference model
with its chunk-by-chunk outputs (shared/fixtures/wenet)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from cache_helpers import tiny_config

from oasr.cache import CacheConfig

# The CI box has 2 shared cores: one intra-op thread avoids oversubscription stalls.
torch.set_num_threads(1)


@pytest.fixture
def make_config() -> Callable[..., CacheConfig]:
    return tiny_config


WENET_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "wenet"
if not WENET_FIXTURES.is_dir():
    WENET_FIXTURES = Path("/work/shared/fixtures/wenet")


@pytest.fixture(scope="session")
def reference() -> dict[str, torch.Tensor]:
    """WeNet's outputs for the fixture utterance (features, chunked encoder and CTC outputs)."""
    with np.load(WENET_FIXTURES / "reference_outputs.npz") as data:
        return {k: torch.from_numpy(data[k]) for k in data.files}


@pytest.fixture(scope="session")
def model() -> torch.nn.Module:
    """The WeNet reference Conformer (4 layers of 4 heads x 36, width 144) as an oasr AsrModel."""
    from oasr.models import AsrModel, ConformerConfig

    meta = json.loads((WENET_FIXTURES / "config.json").read_text())
    config = ConformerConfig(input_dim=meta["input_dim"], vocab_size=meta["output_dim"],
                             **meta["encoder_conf"])
    model = AsrModel(config)
    state = torch.load(WENET_FIXTURES / "state_dict_fp16.pt", weights_only=True)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.eval()
