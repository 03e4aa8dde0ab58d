"""oasr's checkpoint format (`oasr.models.loading.load_model` detects every format).

An oasr model directory holds ``model.safetensors`` (the state_dict), ``config.json``
(``{"format": "oasr", "format_version": 1, "model": "conformer_ctc", "config": {ConformerConfig
fields}, "bpe_model": ...}``) and ``units.txt`` (WeNet's ``<token> <id>`` lines), plus the bpe
model file when there is one. ``"model"`` names the family: ``"conformer_ctc"`` (also when the
key is absent, as in directories written before it existed) or ``"whisper_ctc"``
(`oasr.models.whisper_ctc.checkpoint`, same files).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from oasr.models.asr_model import AsrModel
from oasr.models.config import ConformerConfig

FORMAT_NAME = "oasr"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
UNITS_FILE = "units.txt"
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "default_model"
CONFORMER_CTC = "conformer_ctc"
WHISPER_CTC = "whisper_ctc"
MODEL_FAMILIES = (CONFORMER_CTC, WHISPER_CTC)


def save_model(model: AsrModel, out_dir: str | Path) -> Path:
    """Write ``model`` in oasr's format into ``out_dir`` (created if needed).

    Returns:
        The directory written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": FORMAT_NAME})
    bpe_name = None
    if model.bpe_model is not None:
        bpe_name = model.bpe_model.name
        if model.bpe_model.resolve() != (out / bpe_name).resolve():
            shutil.copyfile(model.bpe_model, out / bpe_name)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "model": CONFORMER_CTC,
        "config": model.config.to_dict(),
        "bpe_model": bpe_name,
    }
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    if model.units is not None:
        from oasr.text.tokenizer import write_units

        write_units(model.units, out / UNITS_FILE)
    return out


def is_oasr_dir(path: Path) -> bool:
    """True when ``path/config.json`` declares oasr's format."""
    cfg = path / CONFIG_FILE
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("format") == FORMAT_NAME
    except (json.JSONDecodeError, AttributeError):
        return False


def model_family_of(path: str | Path) -> str:
    """The family an oasr directory's ``config.json`` declares (``"model"``; absent = Conformer).

    Raises:
        ValueError: not an oasr config, or a family this oasr does not know.
    """
    cfg = Path(path) / CONFIG_FILE
    meta = json.loads(_require_file(cfg).read_text())
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{cfg} is not an oasr config (format={found!r})")
    family = meta.get("model", CONFORMER_CTC)
    if family not in MODEL_FAMILIES:
        raise ValueError(f"{cfg}: unknown model family {family!r}; this oasr serves "
                         f"{', '.join(MODEL_FAMILIES)}")
    return str(family)


def load_oasr_dir(path: str | Path, map_location: str | torch.device = "cpu") -> AsrModel:
    """Load a Conformer-CTC directory written by ``save_model``."""
    path = Path(path)
    meta = json.loads(_require_file(path / CONFIG_FILE).read_text())
    if meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{path / CONFIG_FILE} is not an oasr config (format={meta.get('format')!r})")
    if meta.get("model", CONFORMER_CTC) != CONFORMER_CTC:
        raise ValueError(f"{path / CONFIG_FILE} holds a {meta.get('model')!r} model, not a "
                         f"Conformer-CTC: load it with load_model")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path / CONFIG_FILE}: format_version {meta.get('format_version')} is not supported "
            f"(this oasr reads version {FORMAT_VERSION})"
        )
    config = ConformerConfig.from_dict(meta["config"])
    units = None
    if (path / UNITS_FILE).is_file():
        from oasr.text.tokenizer import read_units

        units = read_units(path / UNITS_FILE)
    bpe = path / meta["bpe_model"] if meta.get("bpe_model") else None
    if bpe is not None:
        _require_file(bpe)
    model = AsrModel(config, units=units, bpe_model=bpe)
    weights = _require_file(path / WEIGHTS_FILE)
    load_weights(model, load_file(str(weights), device=str(map_location)), weights)
    return model.eval()


def load_weights(model: AsrModel, state: dict[str, Tensor], source: Path) -> None:
    """Copy ``state`` into ``model``, strictly: every key present, no extra key, same shapes.

    Raises:
        KeyError: a missing or unexpected key (named, with the file).
        ValueError: a shape mismatch (key, both shapes and the file).
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise KeyError(
            f"{source}: missing keys {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected keys {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}"
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(
                f"{source}: key {key} has shape {tuple(value.shape)}, the model expects "
                f"{tuple(expected[key].shape)}"
            )
    converted = {k: v.to(expected[k].dtype) for k, v in state.items()}
    model.load_state_dict(converted, strict=True)


def _require_file(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"required model file not found: {path}")
    return path
