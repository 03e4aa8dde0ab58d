"""Loading WeNet U2/U2++ experiment directories, and exporting them to oasr's format.

A WeNet dir holds ``train.yaml``, a checkpoint (``final.pt``, or another ``.pt``), ``units.txt``,
optionally a global CMVN file (JSON or Kaldi text) and a sentencepiece ``.model``. Only the
encoder and the CTC head are used; attention-decoder weights (``decoder.*``) are ignored.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from oasr.models.asr_model import AsrModel
from oasr.models.checkpoint import load_weights, save_model
from oasr.models.cmvn import load_cmvn
from oasr.models.config import ConformerConfig

SUPPORTED_ENCODERS = ("conformer",)
# encoder_conf keys mapped one to one onto ConformerConfig fields.
_DIRECT_KEYS = (
    "output_size", "attention_heads", "linear_units", "num_blocks", "dropout_rate",
    "positional_dropout_rate", "attention_dropout_rate", "input_layer", "pos_enc_layer_type",
    "selfattention_layer_type", "normalize_before", "static_chunk_size", "use_dynamic_chunk",
    "use_dynamic_left_chunk", "macaron_style", "activation_type", "use_cnn_module",
    "cnn_module_kernel", "causal", "cnn_module_norm", "query_bias", "key_bias", "value_bias",
    "conv_bias", "norm_eps", "conv_norm_eps",
)
# encoder_conf keys with no effect on inference numerics.
_IGNORED_KEYS = (
    "gradient_checkpointing", "use_sdpa", "global_cmvn", "input_size", "n_expert",
    "n_expert_activated",
)
# encoder_conf keys accepted only at the value that gives the standard Conformer.
_FIXED_KEYS: dict[str, Any] = {
    "layer_norm_type": "layer_norm", "mlp_type": "position_wise_feed_forward",
    "conv_inner_factor": 2, "final_norm": True, "mlp_bias": True,
}
_STATE_PREFIXES = ("encoder.", "ctc.")
_DROPPED_KEYS = ("encoder.embed.pos_enc.pe",)


def config_from_train_yaml(conf: dict[str, Any], source: Path) -> ConformerConfig:
    """Map a parsed WeNet ``train.yaml`` onto a ConformerConfig.

    Raises:
        ValueError: another encoder type, or an ``encoder_conf`` option oasr does not implement.
    """
    encoder = conf.get("encoder", "conformer")
    if encoder not in SUPPORTED_ENCODERS:
        raise ValueError(
            f"{source}: encoder {encoder!r} is not supported; supported encoders: "
            f"{list(SUPPORTED_ENCODERS)}"
        )
    enc_conf = dict(conf.get("encoder_conf") or {})
    for key, allowed in _FIXED_KEYS.items():
        value = enc_conf.pop(key, allowed)
        if value != allowed:
            raise ValueError(f"{source}: encoder_conf.{key}={value!r} is not supported (only {allowed!r})")
    _check_head_layout(enc_conf, source)
    for key in _IGNORED_KEYS:
        enc_conf.pop(key, None)
    unknown = sorted(set(enc_conf) - set(_DIRECT_KEYS))
    if unknown:
        raise ValueError(
            f"{source}: encoder_conf keys {unknown} are not supported; supported keys: "
            f"{sorted(_DIRECT_KEYS)}"
        )
    for key in ("input_dim", "output_dim"):
        if key not in conf:
            raise KeyError(f"{source}: missing top-level key {key!r}")
    ctc_conf = conf.get("ctc_conf") or {}
    return ConformerConfig(
        input_dim=int(conf["input_dim"]),
        vocab_size=int(conf["output_dim"]),
        use_global_cmvn=_wants_cmvn(conf),
        ctc_blank_id=int(ctc_conf.get("ctc_blank_id", 0)),
        **enc_conf,
    )


def _check_head_layout(enc_conf: dict[str, Any], source: Path) -> None:
    heads = enc_conf.get("attention_heads", 4)
    width = enc_conf.get("output_size", 256)
    n_kv = enc_conf.pop("n_kv_head", None)
    head_dim = enc_conf.pop("head_dim", None)
    if n_kv not in (None, heads):
        raise ValueError(f"{source}: n_kv_head={n_kv} != attention_heads={heads} is not supported")
    if head_dim not in (None, width // heads):
        raise ValueError(
            f"{source}: head_dim={head_dim} is not supported (only output_size / attention_heads "
            f"= {width // heads})"
        )


def _wants_cmvn(conf: dict[str, Any]) -> bool:
    cmvn_conf = conf.get("cmvn_conf") or {}
    return conf.get("cmvn") == "global_cmvn" or bool(conf.get("cmvn_file")) or bool(
        cmvn_conf.get("cmvn_file")
    )


def find_checkpoint(directory: Path) -> Path:
    """``final.pt``, else the newest ``avg_*.pt``, else the newest ``*.pt`` in ``directory``."""
    final = directory / "final.pt"
    if final.is_file():
        return final
    for pattern in ("avg_*.pt", "*.pt"):
        found = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    raise FileNotFoundError(f"{directory}: no checkpoint (final.pt or any *.pt) found")


def _find_cmvn_file(conf: dict[str, Any], directory: Path) -> Path | None:
    cmvn_conf = conf.get("cmvn_conf") or {}
    named = cmvn_conf.get("cmvn_file") or conf.get("cmvn_file")
    candidates = [directory / Path(named).name, Path(named)] if named else []
    candidates += [directory / "global_cmvn", directory / "global_cmvn.json"]
    return next((p for p in candidates if p.is_file()), None)


def _find_bpe_model(conf: dict[str, Any], directory: Path) -> Path | None:
    tok_conf = conf.get("tokenizer_conf") or {}
    named = tok_conf.get("bpe_path") or conf.get("bpe_model")
    if named:
        for path in (directory / Path(named).name, Path(named)):
            if path.is_file():
                return path
    models = sorted(directory.glob("*.model"))
    return models[0] if models else None


def _encoder_ctc_state(checkpoint: Path) -> dict[str, Tensor]:
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    if not isinstance(state, dict):
        raise ValueError(f"{checkpoint}: expected a state_dict, got {type(state).__name__}")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    return {
        k: v.float() if v.is_floating_point() else v
        for k, v in state.items()
        if k.startswith(_STATE_PREFIXES) and k not in _DROPPED_KEYS
    }


def load_wenet_dir(directory: str | Path, map_location: str | torch.device = "cpu") -> AsrModel:
    """Build an AsrModel from a WeNet experiment directory (eval mode).

    CMVN statistics stored in the checkpoint (``encoder.global_cmvn.*``) win over the CMVN file;
    the file fills them in when the checkpoint lacks them.

    Raises:
        FileNotFoundError: train.yaml, the checkpoint, units.txt or a needed CMVN file is missing.
        KeyError / ValueError: missing keys or shape mismatches (file and key named).
    """
    directory = Path(directory)
    yaml_path = directory / "train.yaml"
    if not yaml_path.is_file():
        raise FileNotFoundError(f"WeNet dir {directory}: train.yaml not found")
    conf = yaml.safe_load(yaml_path.read_text()) or {}
    config = config_from_train_yaml(conf, yaml_path)
    units_path = directory / "units.txt"
    if not units_path.is_file():
        raise FileNotFoundError(f"WeNet dir {directory}: units.txt not found")
    checkpoint = find_checkpoint(directory)
    state = _encoder_ctc_state(checkpoint)
    if "encoder.global_cmvn.mean" in state and not config.use_global_cmvn:
        config = dataclasses.replace(config, use_global_cmvn=True)
    from oasr.text.tokenizer import read_units

    model = AsrModel(config, read_units(units_path), _find_bpe_model(conf, directory))
    if config.use_global_cmvn and "encoder.global_cmvn.mean" not in state:
        cmvn_path = _find_cmvn_file(conf, directory)
        if cmvn_path is None:
            raise FileNotFoundError(
                f"{checkpoint} has no encoder.global_cmvn.* and no CMVN file was found "
                f"(train.yaml names {(conf.get('cmvn_conf') or {}).get('cmvn_file')!r})"
            )
        state["encoder.global_cmvn.mean"], state["encoder.global_cmvn.istd"] = load_cmvn(cmvn_path)
    load_weights(model, state, checkpoint)
    return model.to(map_location).eval()


def export_wenet(directory: str | Path, out_dir: str | Path) -> Path:
    """Convert a WeNet experiment directory into an oasr model directory; returns ``out_dir``."""
    return save_model(load_wenet_dir(directory), out_dir)
