"""oasr's own checkpoint format: save_model / load_model round trip and error messages."""

from __future__ import annotations

import json

import pytest
import torch
from model_testutil import max_diff
from safetensors.torch import load_file, save_file

from oasr.models import AsrModel, ConformerConfig, load_model, save_model

UNITS = ["<blank>", "<unk>"] + [chr(ord("a") + i) for i in range(26)] + ["'", "▁", "x1", "<sos/eos>"]


def test_round_trip_preserves_outputs_config_and_units(wenet_model: AsrModel, feats, tmp_path):
    model = AsrModel(wenet_model.config, units=UNITS)
    model.load_state_dict(wenet_model.state_dict())
    model.eval()
    save_model(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "config.json", "model.safetensors", "units.txt"
    ]
    loaded = load_model(tmp_path / "m")
    assert loaded.config == model.config
    assert loaded.units == UNITS
    assert not loaded.training
    with torch.no_grad():
        a, _ = model(feats, torch.tensor([512]), 16, -1)
        b, _ = loaded(feats, torch.tensor([512]), 16, -1)
    assert max_diff(a, b) == 0.0
    assert loaded.tokenizer.decode([2, 3, 4]) == "abc"


def test_position_table_is_not_saved(wenet_model: AsrModel, tmp_path):
    save_model(wenet_model, tmp_path)
    keys = load_file(str(tmp_path / "model.safetensors")).keys()
    assert not any("pos_enc.pe" in k for k in keys)
    assert "encoder.global_cmvn.istd" in keys and "ctc.ctc_lo.weight" in keys


def test_batch_norm_model_round_trip(tmp_path):
    cfg = ConformerConfig(output_size=16, attention_heads=2, linear_units=32, num_blocks=1,
                          vocab_size=5, cnn_module_norm="batch_norm", cnn_module_kernel=3)
    model = AsrModel(cfg).eval()
    with torch.no_grad():
        model.encoder.encoders[0].conv_module.norm.running_mean.uniform_(-1, 1)
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    x = torch.randn(1, 40, 80)
    with torch.no_grad():
        assert max_diff(model(x, torch.tensor([40]))[0], loaded(x, torch.tensor([40]))[0]) == 0.0


def test_missing_weights_file_is_named(wenet_model: AsrModel, tmp_path):
    save_model(wenet_model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path)


def test_shape_mismatch_names_file_and_key(wenet_model: AsrModel, tmp_path):
    save_model(wenet_model, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["ctc.ctc_lo.bias"] = torch.zeros(7)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.safetensors: key ctc.ctc_lo.bias has shape \(7,\)"):
        load_model(tmp_path)


def test_missing_key_is_named(wenet_model: AsrModel, tmp_path):
    save_model(wenet_model, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["encoder.after_norm.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match="encoder.after_norm.weight"):
        load_model(tmp_path)


def test_unknown_config_key_is_refused(wenet_model: AsrModel, tmp_path):
    save_model(wenet_model, tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["config"]["bogus"] = 1
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="unknown ConformerConfig keys"):
        load_model(tmp_path)


def test_non_causal_model_is_refused_for_streaming(tmp_path):
    cfg = ConformerConfig(output_size=16, attention_heads=2, linear_units=32, num_blocks=1,
                          vocab_size=5, causal=False)
    save_model(AsrModel(cfg), tmp_path)
    with pytest.raises(ValueError, match="causal: true"):
        load_model(tmp_path)
    assert not load_model(tmp_path, require_streaming=False).config.causal


def test_not_a_model_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an oasr model dir"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(tmp_path / "nope")


def test_kaldi_cmvn_parse_errors_name_the_file(tmp_path):
    from oasr.models import load_cmvn

    bad = tmp_path / "cmvn.ark"
    bad.write_text(" [ 1 2 3 4 ]\n")
    with pytest.raises(ValueError, match=r"cmvn.ark: expected a 2 x \(D\+1\) stats matrix"):
        load_cmvn(bad)
    good = tmp_path / "ok.ark"
    good.write_text(" [\n  2 4 2\n  4 10 0 ]\n")  # sums, count 2; squares
    mean, istd = load_cmvn(good)
    assert mean.tolist() == [1.0, 2.0]
    assert torch.allclose(istd, torch.tensor([1.0, 1.0]))
