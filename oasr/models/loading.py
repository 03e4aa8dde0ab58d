"""Load a streaming model of any family from its directory: the one entry point that knows
every checkpoint format (oasr's own, WeNet's, icefall's)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from oasr.models.asr_model import AsrModel
from oasr.models.checkpoint import (
    CONFIG_FILE,
    DEFAULT_MODEL_DIR,
    WEIGHTS_FILE,
    WHISPER_CTC,
    is_oasr_dir,
    load_oasr_dir,
    model_family_of,
)

if TYPE_CHECKING:
    from oasr.models.whisper_ctc.model import WhisperCtcModel
    from oasr.models.zipformer.model import ZipformerModel


def load_model(
    path: str | Path | None = None,
    map_location: str | torch.device = "cpu",
    require_streaming: bool = True,
    chunk_size: int = 16,
    left_context_frames: int = 64,
) -> AsrModel | WhisperCtcModel | ZipformerModel:
    """Load a streaming model of any family from a directory.

    Args:
        path: an oasr dir (config.json + model.safetensors + units.txt; ``"model"`` in
            config.json picks the family: ``"conformer_ctc"``, the default, or
            ``"whisper_ctc"``), a WeNet dir (train.yaml + a .pt checkpoint + units.txt +
            optional CMVN / bpe model), an icefall Zipformer experiment dir (pretrained.pt or
            epoch-N.pt / checkpoint-N.pt + train_args.json or a log + tokens.txt), or None for
            the bundled default model.
        map_location: device the weights are loaded to.
        require_streaming: refuse Conformers that cannot run chunk by chunk (non-causal conv);
            Whisper-CTC models always stream.
        chunk_size, left_context_frames: an icefall Zipformer's decode-time chunk and left
            context (50 Hz frames; icefall's --chunk-size / --left-context-frames); -1, -1 for
            full context. Other families ignore them.
    Returns:
        The model in eval mode: an `AsrModel` (Conformer-CTC), a `WhisperCtcModel` or a
        `ZipformerModel`.
    """
    directory = DEFAULT_MODEL_DIR if path is None else Path(path)
    if not directory.is_dir():
        what = "bundled default model" if path is None else "model directory"
        raise FileNotFoundError(f"{what} not found: {directory}")
    if is_oasr_dir(directory):
        if model_family_of(directory) == WHISPER_CTC:
            from oasr.models.whisper_ctc.checkpoint import load_whisper_ctc_dir

            return load_whisper_ctc_dir(directory, map_location)
        model = load_oasr_dir(directory, map_location)
    elif (directory / "train.yaml").is_file():
        from oasr.models.wenet import load_wenet_dir

        model = load_wenet_dir(directory, map_location)
    else:
        from oasr.models.zipformer.checkpoint import is_icefall_dir, load_icefall_dir

        if is_icefall_dir(directory):
            return load_icefall_dir(directory, chunk_size, left_context_frames, map_location)
        raise FileNotFoundError(
            f"{directory} is neither an oasr model dir ({CONFIG_FILE} with format 'oasr' + "
            f"{WEIGHTS_FILE}), a WeNet dir (train.yaml + a .pt checkpoint) nor an icefall "
            "experiment dir (pretrained.pt, epoch-N.pt or checkpoint-N.pt)"
        )
    if require_streaming and not model.config.is_streamable():
        raise ValueError(
            f"{directory}: streaming needs causal: true in encoder_conf (the causal depthwise "
            "conv); this model's conv module is non-causal. Pass require_streaming=False to "
            "load it for full-utterance decoding only."
        )
    return model
