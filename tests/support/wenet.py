"""The WeNet reference fixture (``tests/data/fixtures/wenet``) as oasr objects.

A 4-block, 144-wide causal Conformer-CTC with seeded random weights, and the outputs WeNet's own
code gave for it (features, full and chunk-by-chunk encoder outputs, CTC log-probs, caches).
"""

from __future__ import annotations

import json

import numpy as np
import torch

from oasr.models import AsrModel, ConformerConfig
from support.paths import WENET_FIXTURE_DIR


def fixture_config() -> ConformerConfig:
    """The fixture's ``config.json`` as a `ConformerConfig`."""
    meta = json.loads((WENET_FIXTURE_DIR / "config.json").read_text())
    return ConformerConfig(input_dim=meta["input_dim"], vocab_size=meta["output_dim"],
                           **meta["encoder_conf"])


def fixture_state_dict() -> dict[str, torch.Tensor]:
    """The fixture's weights in float32 (stored as float16, every value exact in it)."""
    state = torch.load(WENET_FIXTURE_DIR / "state_dict_fp16.pt", weights_only=True)
    return {k: v.float() for k, v in state.items()}


def fixture_model() -> AsrModel:
    """The fixture's weights in an oasr `AsrModel` (eval, float32, CPU)."""
    model = AsrModel(fixture_config())
    model.load_state_dict(fixture_state_dict(), strict=True)
    return model.eval()


def reference_outputs() -> dict[str, np.ndarray]:
    """Every array of ``reference_outputs.npz`` (see the fixture's README for the keys)."""
    with np.load(WENET_FIXTURE_DIR / "reference_outputs.npz") as data:
        return {k: data[k] for k in data.files}
