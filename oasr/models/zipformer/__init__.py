"""icefall's streaming Zipformer2 (transducer and CTC) for oasr's slot runtime: the model
with icefall's API, its declared per-stream state and the experiment-directory loader."""

from oasr.models.zipformer.checkpoint import is_icefall_dir, load_icefall_dir
from oasr.models.zipformer.config import ZipformerConfig
from oasr.models.zipformer.model import LOG_EPS, ZipformerModel
from oasr.models.zipformer.states import zipformer_state_specs

__all__ = [
    "LOG_EPS",
    "ZipformerConfig",
    "ZipformerModel",
    "is_icefall_dir",
    "load_icefall_dir",
    "zipformer_state_specs",
]
