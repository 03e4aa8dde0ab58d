"""Writes CTranslate2 ``model.bin`` files (binary version 6) for the reader's tests, and a tiny
Whisper checkpoint directory (model.bin, config.json, tokenizer.json) from a torch model."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from oasr.models.whisper import WhisperModel
from oasr.models.whisper.loader import ct2_name_map

DTYPE_CODES = {np.dtype("float32"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2,
               np.dtype("int32"): 3, np.dtype("float16"): 4}


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_model_bin(path: Path, variables: dict[str, np.ndarray], aliases: dict[str, str],
                    spec: str = "WhisperSpec", version: int = 6,
                    raw_codes: dict[str, int] | None = None) -> None:
    """``raw_codes`` overrides a variable's dtype code (bf16 = 5 given as uint16 bits)."""
    out = [struct.pack("<I", version), _string(spec), struct.pack("<I", 3),
           struct.pack("<I", len(variables))]
    for name, array in variables.items():
        array = np.ascontiguousarray(array)
        code = (raw_codes or {}).get(name, DTYPE_CODES.get(array.dtype))
        out += [_string(name), struct.pack("<B", array.ndim),
                struct.pack(f"<{array.ndim}I", *array.shape), struct.pack("<B", code),
                struct.pack("<I", array.nbytes), array.tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    path.write_bytes(b"".join(out))


def quantize_int8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row int8 with CTranslate2's convention: q = round(w * scale), scale = 127 / amax."""
    scale = (127.0 / np.abs(weight).reshape(weight.shape[0], -1).max(axis=1)).astype(np.float32)
    q = np.round(weight * scale.reshape(-1, *([1] * (weight.ndim - 1))))
    return q.astype(np.int8), scale


def write_tiny_tokenizer(path: Path, vocab_size: int) -> None:
    """Word-level tokenizer: words w0..w{eot-1}, then the three specials Whisper needs."""
    eot = vocab_size - 4
    vocab = {f"w{i}": i for i in range(eot)}
    vocab.update({"<|endoftext|>": eot, "<|startoftranscript|>": eot + 1,
                  "<|notimestamps|>": eot + 2, "<unk>": eot + 3})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def write_whisper_dir(model: WhisperModel, out: Path, weights: str = "float16") -> Path:
    """A CTranslate2-layout checkpoint of ``model``: ``weights`` float16 | float32 | int8."""
    out.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    variables: dict[str, np.ndarray] = {}
    for ours, theirs in ct2_name_map(model.config).items():
        array = state[ours].detach().float().numpy()
        if weights == "int8" and array.ndim == 2 and "position" not in theirs:
            variables[theirs], variables[f"{theirs}_scale"] = quantize_int8(array)
        else:
            variables[theirs] = array.astype(np.float16 if weights == "float16" else np.float32)
    variables["encoder/num_heads"] = np.array(model.config.n_audio_head, dtype=np.int16)
    variables["decoder/num_heads"] = np.array(model.config.n_text_head, dtype=np.int16)
    for flag, value in (("activation", 3), ("alibi", 0), ("pre_norm", 1), ("scale_embeddings", 0)):
        variables[f"decoder/{flag}"] = np.array(value, dtype=np.int8)
    write_model_bin(out / "model.bin", variables,
                    {"decoder/projection/weight": "decoder/embeddings/weight"})
    eot = model.config.n_vocab - 4
    (out / "config.json").write_text(json.dumps({"suppress_ids": [eot + 3],
                                                 "suppress_ids_begin": [eot]}))
    write_tiny_tokenizer(out / "tokenizer.json", model.config.n_vocab)
    return out


def torch_state(model: WhisperModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
