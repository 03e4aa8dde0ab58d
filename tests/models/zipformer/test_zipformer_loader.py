"""Loading icefall experiment directories: argument sources, shape inference, key errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support.paths import ZIPFORMER_FIXTURE_DIR

from oasr.models import load_model
from oasr.models.zipformer import ZipformerModel, load_icefall_dir
from oasr.models.zipformer.checkpoint import parse_args_text


def _copy(tmp_path: Path, *names: str) -> Path:
    for name in names:
        shutil.copy(ZIPFORMER_FIXTURE_DIR / name, tmp_path / name)
    return tmp_path


def _same_weights(a: ZipformerModel, b: ZipformerModel) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_load_model_detects_an_icefall_dir():
    model = load_model(ZIPFORMER_FIXTURE_DIR)
    assert isinstance(model, ZipformerModel)
    assert (model.config.chunk_size, model.config.left_context_frames) == (16, 64)
    assert model.tokens is not None and model.tokens[0] == "<blk>" and len(model.tokens) == 50
    full = load_model(ZIPFORMER_FIXTURE_DIR, chunk_size=-1, left_context_frames=-1)
    assert isinstance(full, ZipformerModel) and not full.config.is_streaming


def test_shapes_alone_give_the_architecture(tmp_path):
    """No arguments file: every width, count, kernel, head and head dim read off the shapes."""
    d = _copy(tmp_path, "pretrained.pt")
    inferred = load_icefall_dir(d)
    ref = load_icefall_dir(ZIPFORMER_FIXTURE_DIR)
    assert inferred.config == ref.config
    assert _same_weights(inferred, ref)


def test_arguments_from_a_training_log_and_from_a_text_file(tmp_path):
    args = json.loads((ZIPFORMER_FIXTURE_DIR / "train_args.json").read_text())
    log = tmp_path / "log"
    log.mkdir()
    (log / "log-train-2024-01-01").write_text(
        "2024-01-01 00:00:00,000 INFO [train.py:1] Training started\n"
        "2024-01-01 00:00:00,001 INFO [train.py:2] " + repr(dict(args, best_train_loss=1.0)) + "\n")
    assert {k: v for k, v in parse_args_text(log.joinpath("log-train-2024-01-01").read_text()).items()
            } == {k: v for k, v in args.items() if k in parse_args_text(repr(args))}
    text = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in args.items())
    parsed = parse_args_text(text)
    assert parsed["encoder_dim"] == "32,48,64,80,64,48" and parsed["context_size"] == "2"
    _copy(tmp_path, "pretrained.pt", "tokens.txt")
    assert load_icefall_dir(tmp_path).config == load_icefall_dir(ZIPFORMER_FIXTURE_DIR).config


def test_epoch_checkpoint_and_training_only_keys(tmp_path):
    state = torch.load(ZIPFORMER_FIXTURE_DIR / "pretrained.pt", weights_only=False)["model"]
    assert any(k.startswith("simple_am_proj") for k in state)  # ignored by name
    torch.save({"model": state, "optimizer": {}}, tmp_path / "epoch-3.pt")
    torch.save({"model": {}}, tmp_path / "epoch-2.pt")  # older: not picked
    _copy(tmp_path, "train_args.json")
    assert _same_weights(load_icefall_dir(tmp_path), load_icefall_dir(ZIPFORMER_FIXTURE_DIR))


def test_unknown_and_missing_keys_are_named(tmp_path):
    state = torch.load(ZIPFORMER_FIXTURE_DIR / "pretrained.pt", weights_only=False)["model"]
    state["encoder.encoders.0.layers.0.mystery.weight"] = torch.zeros(1)
    del state["joiner.output_linear.bias"]
    torch.save({"model": state}, tmp_path / "pretrained.pt")
    _copy(tmp_path, "train_args.json")
    with pytest.raises(KeyError, match=r"mystery\.weight.*joiner\.output_linear\.bias"):
        load_icefall_dir(tmp_path)


def test_mismatched_arguments_name_the_key_and_shapes(tmp_path):
    args = json.loads((ZIPFORMER_FIXTURE_DIR / "train_args.json").read_text())
    args["feedforward_dim"] = "64,96,128,160,128,64"
    (tmp_path / "train_args.json").write_text(json.dumps(args))
    _copy(tmp_path, "pretrained.pt")
    with pytest.raises(ValueError, match=r"encoder\.stacks\.5\.layers\.0\.feed_forward\d.*shape"):
        load_icefall_dir(tmp_path)


@pytest.mark.parametrize(("chunk", "left", "match"), [
    (12, 64, "multiple of 2 and of every downsampling factor"),
    (16, 20, "left_context_frames 20"),
    (16, 8, "shorter than a conv kernel"),
])
def test_bad_decode_settings(chunk, left, match):
    with pytest.raises(ValueError, match=match):
        load_icefall_dir(ZIPFORMER_FIXTURE_DIR, chunk, left)


def test_no_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="pretrained.pt"):
        load_icefall_dir(tmp_path)
