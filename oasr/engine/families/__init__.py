"""Model families: what the engine needs from an encoder, one module per family
(`base` says what a family provides)."""

from __future__ import annotations

from torch import nn

from oasr.engine.families.base import (
    FEATURE_SHIFT_S,
    ChunkBatch,
    FrameTiming,
    KVGeometry,
    ModelFamily,
)
from oasr.engine.families.conformer import ConformerFamily
from oasr.engine.families.whisper_ctc import WhisperCtcFamily
from oasr.models import AsrModel

__all__ = ["FEATURE_SHIFT_S", "ChunkBatch", "ConformerFamily", "FrameTiming", "KVGeometry",
           "ModelFamily", "WhisperCtcFamily", "family_for"]


def family_for(model: nn.Module) -> ModelFamily:
    """The family adapter of a loaded model.

    Raises:
        TypeError: a model of no known family.
    """
    if isinstance(model, AsrModel):
        return ConformerFamily(model)
    from oasr.models.whisper_ctc.model import WhisperCtcModel

    if isinstance(model, WhisperCtcModel):
        return WhisperCtcFamily(model)
    from oasr.models.zipformer.model import ZipformerModel

    if isinstance(model, ZipformerModel):
        from oasr.engine.families.zipformer import ZipformerFamily

        return ZipformerFamily(model)
    raise TypeError(
        f"no model family serves {type(model).__name__}: expected an AsrModel (Conformer-CTC), "
        "a WhisperCtcModel or a ZipformerModel"
    )
