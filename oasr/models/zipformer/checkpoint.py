"""Loading an icefall Zipformer experiment directory.

A directory holds the training arguments (``train_args.json``; or the arguments as a
``--key value`` text file; or a training log, whose first lines print icefall's params dict),
a checkpoint (``pretrained.pt`` as ``export.py`` writes it, else the newest ``epoch-N.pt`` /
``checkpoint-N.pt``; ``{"model": state_dict}`` or a bare state dict) and ``tokens.txt``
(``bpe.model`` when present). What the arguments leave out and the checkpoint's shapes tell
(widths, layer counts, kernels, heads, vocabulary, heads present) is read off the shapes;
the rest takes icefall's ``train.py`` defaults.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from oasr.models.zipformer.config import PER_STACK, ZipformerConfig, per_stack
from oasr.models.zipformer.model import ZipformerModel

ARGS_FILES = ("train_args.json", "train_args.txt", "args.txt")
LOG_GLOBS = ("log/log-train-*", "log-train-*")
# training-only parameters icefall checkpoints carry: the pruned RNN-T projections, the
# attention-decoder head (not used for streaming), and a per-layer bypass_scale icefall marks
# "TODO: remove it" (the used ones are layers.{i}.bypass.* and layers.{i}.bypass_mid.*)
IGNORED_KEYS = (
    re.compile(r"simple_(am|lm)_proj\..*"),
    re.compile(r"attention_decoder\..*"),
    re.compile(r"encoder\.encoders\.\d+\.(encoder\.)?layers\.\d+\.bypass_scale"),
)
_RENAMES = (  # icefall name -> oasr name (everything else is the same)
    (re.compile(r"^encoder_embed\.conv\.0\."), "encoder_embed.conv1."),
    (re.compile(r"^encoder_embed\.conv\.4\."), "encoder_embed.conv2."),
    (re.compile(r"^encoder_embed\.conv\.7\."), "encoder_embed.conv3."),
    (re.compile(r"^encoder\.encoders\.(\d+)\.(encoder\.)?layers\."), r"encoder.stacks.\1.layers."),
    (re.compile(r"^encoder\.encoders\.(\d+)\.downsample\.bias$"), r"encoder.stacks.\1.downsample_bias"),
    (re.compile(r"^encoder\.encoders\.(\d+)\.out_combiner\."), r"encoder.stacks.\1.out_combiner."),
    (re.compile(r"^encoder\.downsample_output\.bias$"), "encoder.downsample_output_bias"),
    (re.compile(r"^ctc_output\.1\."), "ctc_proj."),
)


def is_icefall_dir(path: Path) -> bool:
    """True when ``path`` holds an icefall checkpoint (pretrained.pt / epoch-N.pt / ...)."""
    return _find_checkpoint(path, required=False) is not None


def load_icefall_dir(path: str | Path, chunk_size: int = 16, left_context_frames: int = 64,
                     map_location: str | torch.device = "cpu") -> ZipformerModel:
    """Build and load the Zipformer of an icefall experiment directory, in eval mode.

    Args:
        chunk_size, left_context_frames: the decode-time setting in 50 Hz frames (icefall's
            ``--chunk-size`` / ``--left-context-frames``); -1, -1 for full context.
    Raises:
        FileNotFoundError: no checkpoint. KeyError: missing or unknown weights (named).
        ValueError: shapes that do not match the arguments, or a bad argument.
    """
    path = Path(path)
    ckpt = _find_checkpoint(path, required=True)
    assert ckpt is not None
    state = _state_dict(torch.load(ckpt, map_location=map_location, weights_only=False), ckpt)
    stated = read_train_args(path)
    inferred = infer_args(state, stated)
    args = {**inferred, **stated}
    if not inferred.get("causal", True):
        raise ValueError(f"{ckpt}: a non-causal Zipformer (train.py --causal 0); oasr serves "
                         "the causal (streaming) ones")
    config = ZipformerConfig.from_train_args(args, chunk_size, left_context_frames)
    tokens = read_tokens(path / "tokens.txt") if (path / "tokens.txt").is_file() else None
    if tokens is not None and len(tokens) != config.vocab_size:
        raise ValueError(f"{path / 'tokens.txt'} has {len(tokens)} tokens, the model "
                         f"{config.vocab_size} outputs")
    bpe = path / "bpe.model" if (path / "bpe.model").is_file() else None
    model = ZipformerModel(config, tokens=tokens, bpe_model=bpe)
    load_icefall_state(model, state, ckpt)
    return model.eval()


def load_icefall_state(model: ZipformerModel, state: dict[str, Tensor], source: Path) -> None:
    """Copy an icefall state dict into ``model`` strictly (training-only keys skipped).

    Raises:
        KeyError: missing or unknown keys, named. ValueError: a shape mismatch, named.
    """
    renamed: dict[str, Tensor] = {}
    unknown = []
    expected = model.state_dict()
    for key, value in state.items():
        if any(p.fullmatch(key) for p in IGNORED_KEYS):
            continue
        ours = oasr_key(key)
        if ours in expected:
            renamed[ours] = value
        else:
            unknown.append(key)
    missing = [k for k in expected if k not in renamed]
    if unknown or missing:
        raise KeyError(f"{source}: unknown keys {unknown[:8]}{'...' if len(unknown) > 8 else ''}"
                       f", missing keys {missing[:8]}{'...' if len(missing) > 8 else ''}")
    for key, value in renamed.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(f"{source}: {key} has shape {tuple(value.shape)}, the model built "
                             f"from the arguments expects {tuple(expected[key].shape)}")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in renamed.items()}, strict=True)


def oasr_key(key: str) -> str:
    """icefall's parameter name -> this model's."""
    for pattern, repl in _RENAMES:
        if pattern.search(key):
            return pattern.sub(repl, key)
    return key


def infer_args(state: dict[str, Tensor], stated: dict[str, Any] | None = None) -> dict[str, Any]:
    """The train.py arguments a state dict's shapes determine.

    The head geometry needs one assumption: ``pos_head_dim`` (stated, else icefall's 4) gives
    the heads (``linear_pos`` rows / pos_head_dim), then the query and value head dims.
    """
    stacks = sorted({int(m.group(1)) for k in state
                     if (m := re.match(r"encoder\.encoders\.(\d+)\.", k))})
    if not stacks:
        return {}
    out: dict[str, Any] = {}
    layers, dims, ffs, kernels, ds, heads, qdims, vdims = [], [], [], [], [], [], [], []
    pos_head = per_stack((stated or {}).get("pos_head_dim", 4), len(stacks), "pos_head_dim")
    for s in stacks:
        prefix = f"encoder.encoders.{s}." + ("" if s == 0 else "encoder.")
        n = len({m.group(1) for k in state if (m := re.match(re.escape(prefix) + r"layers\.(\d+)\.", k))})
        layers.append(n)
        dims.append(state[prefix + "layers.0.norm.bias"].shape[0])
        ffs.append(state[prefix + "layers.0.feed_forward2.in_proj.weight"].shape[0])
        dw = prefix + "layers.0.conv_module1.depthwise_conv."
        dw += "chunkwise_conv.weight" if dw + "chunkwise_conv.weight" in state else "weight"
        kernels.append(state[dw].shape[-1])
        h = state[prefix + "layers.0.self_attn_weights.linear_pos.weight"].shape[0] // pos_head[s]
        heads.append(h)
        qdims.append((state[prefix + "layers.0.self_attn_weights.in_proj.weight"].shape[0] // h
                      - pos_head[s]) // 2)
        vdims.append(state[prefix + "layers.0.self_attn1.in_proj.weight"].shape[0] // h)
        bias = state.get(f"encoder.encoders.{s}.downsample.bias")
        ds.append(1 if bias is None else bias.shape[0])
    for name, values in (("num_encoder_layers", layers), ("encoder_dim", dims),
                         ("feedforward_dim", ffs), ("cnn_module_kernel", kernels),
                         ("downsampling_factor", ds), ("num_heads", heads),
                         ("query_head_dim", qdims), ("value_head_dim", vdims),
                         ("pos_head_dim", pos_head)):
        out[name] = ",".join(str(v) for v in values)
    out["pos_dim"] = state["encoder.encoders.0.layers.0.self_attn_weights.linear_pos.weight"].shape[1]
    out["causal"] = any(k.endswith("depthwise_conv.causal_conv.weight") for k in state)
    out["use_ctc"] = "ctc_output.1.weight" in state
    out["use_transducer"] = "joiner.output_linear.weight" in state
    if "decoder.embedding.weight" in state:
        out["vocab_size"], out["decoder_dim"] = state["decoder.embedding.weight"].shape
        out["joiner_dim"] = state["joiner.output_linear.weight"].shape[1]
        ctx = state.get("decoder.conv.weight")
        out["context_size"] = 1 if ctx is None else ctx.shape[-1]
    elif "ctc_output.1.weight" in state:
        out["vocab_size"] = state["ctc_output.1.weight"].shape[0]
    return {k: int(v) if isinstance(v, int) else v for k, v in out.items()}


def read_train_args(path: Path) -> dict[str, Any]:
    """The training arguments stated in ``path`` (empty when none is found).

    Raises:
        ValueError: a file that cannot be parsed.
    """
    for name in ARGS_FILES:
        f = path / name
        if f.is_file():
            text = f.read_text(encoding="utf-8")
            if name.endswith(".json"):
                try:
                    return dict(json.loads(text))
                except (json.JSONDecodeError, TypeError, ValueError) as exc:
                    raise ValueError(f"{f}: not a JSON object of train.py arguments: {exc}") from None
            return parse_args_text(text)
    for pattern in LOG_GLOBS:
        for f in sorted(path.glob(pattern)):
            args = parse_args_text(f.read_text(encoding="utf-8", errors="replace"))
            if args:
                return args
    return {}


def parse_args_text(text: str) -> dict[str, Any]:
    """``--key value`` arguments, or the ``{'key': value, ...}`` params dict a training log
    prints; only the architecture's keys are kept."""
    wanted = set(PER_STACK) | {"pos_dim", "feature_dim", "decoder_dim", "joiner_dim",
                               "context_size", "vocab_size", "blank_id", "use_transducer",
                               "use_ctc", "causal"}
    out: dict[str, Any] = {}
    for m in re.finditer(r"--([\w-]+)[ =]+(\S+)", text):
        key = m.group(1).replace("-", "_")
        if key in wanted:
            out[key] = m.group(2).strip("'\"")
    for m in re.finditer(r"'(\w+)': ('[^']*'|[\w.+-]+)", text):
        if m.group(1) in wanted and m.group(1) not in out:
            try:
                out[m.group(1)] = ast.literal_eval(m.group(2))
            except (ValueError, SyntaxError):
                out[m.group(1)] = m.group(2)
    return out


def read_tokens(path: Path) -> list[str]:
    """icefall's tokens.txt (``<symbol> <id>`` lines) as ``tokens[id]``.

    Raises:
        ValueError: a malformed line or ids that are not 0..N-1.
    """
    by_id: dict[int, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].isdigit():
            raise ValueError(f"{path}:{lineno}: expected '<symbol> <id>', got {line!r}")
        by_id[int(parts[1])] = parts[0]
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError(f"{path}: ids are not 0..{len(by_id) - 1}")
    return [by_id[i] for i in range(len(by_id))]


def _find_checkpoint(path: Path, required: bool) -> Path | None:
    if (path / "pretrained.pt").is_file():
        return path / "pretrained.pt"
    for stem in ("epoch", "checkpoint"):
        numbered = [(int(m.group(1)), f) for f in path.glob(f"{stem}-*.pt")
                    if (m := re.fullmatch(rf"{stem}-(\d+)\.pt", f.name))]
        if numbered:
            return max(numbered)[1]
    if required:
        raise FileNotFoundError(f"{path}: no icefall checkpoint (pretrained.pt, epoch-N.pt or "
                                "checkpoint-N.pt)")
    return None


def _state_dict(obj: Any, source: Path) -> dict[str, Tensor]:
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"{source}: expected {{'model': state_dict}} or a state dict")
    return obj
