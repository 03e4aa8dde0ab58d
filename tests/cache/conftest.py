"""Fixtures for cache tests: tiny CPU pools (see cache_helpers) and the WeNet reference model
with its chunk-by-chunk outputs (tests/data/fixtures/wenet)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from cache_helpers import tiny_config
from support.wenet import fixture_model, reference_outputs

from oasr.cache import CacheConfig

# The CI box has 2 shared cores: one intra-op thread avoids oversubscription stalls.
torch.set_num_threads(1)


@pytest.fixture
def make_config() -> Callable[..., CacheConfig]:
    return tiny_config


@pytest.fixture(scope="session")
def reference() -> dict[str, torch.Tensor]:
    """WeNet's outputs for the fixture utterance (features, chunked encoder and CTC outputs)."""
    return {k: torch.from_numpy(v) for k, v in reference_outputs().items()}


@pytest.fixture(scope="session")
def model() -> torch.nn.Module:
    """The WeNet reference Conformer (4 layers of 4 heads x 36, width 144) as an oasr AsrModel."""
    return fixture_model()
