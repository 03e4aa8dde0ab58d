"""Streaming Conformer-CTC models: layers, encoder, checkpoint loading (oasr and WeNet formats)."""

from oasr.models.asr_model import AsrModel
from oasr.models.checkpoint import load_model, save_model
from oasr.models.cmvn import GlobalCMVN, load_cmvn
from oasr.models.config import ConformerConfig
from oasr.models.conformer import ConformerEncoder
from oasr.models.ctc import CTC

__all__ = [
    "CTC",
    "AsrModel",
    "ConformerConfig",
    "ConformerEncoder",
    "GlobalCMVN",
    "load_cmvn",
    "load_model",
    "save_model",
]
