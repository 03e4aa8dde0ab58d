"""Fixtures of the icefall Zipformer2 tests: the reference outputs and icefall's decode loop."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from support.paths import ZIPFORMER_FIXTURE_DIR
from torch import Tensor
from zipformer_helpers import StreamRecord, icefall_decode_loop

from oasr.models.zipformer import ZipformerModel


@pytest.fixture(scope="session")
def ref() -> dict[str, np.ndarray]:
    with np.load(ZIPFORMER_FIXTURE_DIR / "reference_outputs.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="session")
def decode_loop() -> Callable[[ZipformerModel, list[Tensor]], list[StreamRecord]]:
    return icefall_decode_loop
