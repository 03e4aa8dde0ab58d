"""Streaming Conformer-CTC models: layers, encoder, checkpoint loading (oasr and WeNet formats)."""

from oasr.models.asr_model import AsrModel
from oasr.models.checkpoint import load_model, save_model
from oasr.models.cmvn import GlobalCMVN, load_cmvn
from oasr.models.config import ConformerConfig
from oasr.models.conformer import ConformerEncoder
from oasr.models.ctc import CTC
from oasr.models.wenet import export_wenet, load_wenet_dir

__all__ = [
    "CTC",
    "AsrModel",
    "ConformerConfig",
    "ConformerEncoder",
    "GlobalCMVN",
    "export_wenet",
    "load_cmvn",
    "load_model",
    "load_wenet_dir",
    "save_model",
]
