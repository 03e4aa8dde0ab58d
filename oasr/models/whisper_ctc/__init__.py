"""Whisper-encoder CTC: Whisper tiny.en's encoder made chunk-causal, with a CTC head over
oasr's character units; oasr's second streaming encoder family."""

from oasr.models.whisper_ctc.checkpoint import (
    init_from_whisper,
    load_whisper_ctc_dir,
    save_whisper_ctc,
)
from oasr.models.whisper_ctc.config import WhisperCtcConfig
from oasr.models.whisper_ctc.frontend import CausalLogMel, causal_log_mel
from oasr.models.whisper_ctc.model import WhisperCtcModel, chunk_mask

__all__ = [
    "CausalLogMel",
    "WhisperCtcConfig",
    "WhisperCtcModel",
    "causal_log_mel",
    "chunk_mask",
    "init_from_whisper",
    "load_whisper_ctc_dir",
    "save_whisper_ctc",
]
