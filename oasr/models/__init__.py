"""Streaming CTC models: the Conformer (layers, encoder, oasr and WeNet checkpoints) and, in
``oasr.models.whisper_ctc``, the Whisper-encoder CTC family; ``load_model`` loads either."""

from oasr.models.asr_model import AsrModel
from oasr.models.checkpoint import MODEL_FAMILIES, model_family_of, save_model
from oasr.models.cmvn import GlobalCMVN, load_cmvn
from oasr.models.config import ConformerConfig
from oasr.models.conformer import ConformerEncoder
from oasr.models.ctc import CTC
from oasr.models.loading import load_model
from oasr.models.wenet import export_wenet, load_wenet_dir

__all__ = [
    "CTC",
    "AsrModel",
    "ConformerConfig",
    "ConformerEncoder",
    "MODEL_FAMILIES",
    "GlobalCMVN",
    "export_wenet",
    "load_cmvn",
    "load_model",
    "load_wenet_dir",
    "model_family_of",
    "save_model",
]
