"""Shared fixtures for model tests: the WeNet reference model and its outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.wenet import fixture_model, reference_outputs

from oasr.models import AsrModel

# The CI box has 2 shared cores: one intra-op thread avoids oversubscription stalls.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def reference() -> dict[str, np.ndarray]:
    return reference_outputs()


@pytest.fixture(scope="session")
def wenet_model() -> AsrModel:
    """The fixture's weights in an oasr AsrModel (eval, float32, CPU)."""
    return fixture_model()


@pytest.fixture(scope="session")
def feats(reference: dict[str, np.ndarray]) -> torch.Tensor:
    """(1, 512, 80) raw fbank of the reference utterance."""
    return torch.from_numpy(reference["feats"]).unsqueeze(0)
