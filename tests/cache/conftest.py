"""Fixtures for cache tests (tiny CPU pools; see cache_helpers)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from cache_helpers import tiny_config

from oasr.cache import CacheConfig

# The CI box has 2 shared cores: one intra-op thread avoids oversubscription stalls.
torch.set_num_threads(1)


@pytest.fixture
def make_config() -> Callable[..., CacheConfig]:
    return tiny_config
