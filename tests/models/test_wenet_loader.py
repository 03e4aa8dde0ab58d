"""Loading a WeNet-style experiment directory assembled from the fixture, and export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from model_testutil import max_diff
from support.paths import WENET_FIXTURE_DIR

from oasr.models import export_wenet, load_model

UNITS = ["<blank>", "<unk>"] + [chr(ord("a") + i) for i in range(26)] + ["'", "▁", "x1", "<sos/eos>"]


def _make_wenet_dir(root: Path, with_cmvn_in_ckpt: bool = True, cmvn: str = "json") -> Path:
    """train.yaml + final.pt (fp16 weights, a decoder key, the pe buffer) + units.txt + CMVN."""
    root.mkdir(parents=True, exist_ok=True)
    conf = yaml.safe_load((WENET_FIXTURE_DIR / "train.yaml").read_text())
    state = torch.load(WENET_FIXTURE_DIR / "state_dict_fp16.pt", weights_only=True)
    state["decoder.embed.0.weight"] = torch.zeros(32, 8)
    state["encoder.embed.pos_enc.pe"] = torch.zeros(1, 5000, 144)
    if not with_cmvn_in_ckpt:
        del state["encoder.global_cmvn.mean"], state["encoder.global_cmvn.istd"]
    torch.save(state, root / "final.pt")
    (root / "units.txt").write_text("".join(f"{u} {i}\n" for i, u in enumerate(UNITS)))
    if cmvn == "json":
        shutil.copyfile(WENET_FIXTURE_DIR / "global_cmvn.json", root / "global_cmvn")
        conf["cmvn_conf"]["cmvn_file"] = "/somewhere/else/exp/global_cmvn"
    else:
        stats = json.loads((WENET_FIXTURE_DIR / "global_cmvn.json").read_text())
        row0 = " ".join(str(v) for v in stats["mean_stat"]) + f" {stats['frame_num']}"
        row1 = " ".join(str(v) for v in stats["var_stat"]) + " 0"
        (root / "global_cmvn").write_text(f" [\n  {row0}\n  {row1} ]\n")
        conf["cmvn_conf"] = {"cmvn_file": "global_cmvn", "is_json_cmvn": False}
    (root / "train.yaml").write_text(yaml.safe_dump(conf))
    return root


@pytest.mark.parametrize(("in_ckpt", "cmvn"), [(True, "json"), (False, "json"), (False, "kaldi")])
def test_wenet_dir_reproduces_wenet_outputs(tmp_path, feats, reference, in_ckpt, cmvn):
    model = load_model(_make_wenet_dir(tmp_path / "exp", in_ckpt, cmvn))
    assert model.units == UNITS and model.config.output_size == 144
    with torch.no_grad():
        enc, _ = model.encoder(feats, torch.tensor([512]), 16, 4)
        logp = model.ctc_log_probs(enc)
    assert max_diff(enc[0], reference["enc_full_chunk16_left4"]) <= 1e-4
    assert max_diff(logp[0], reference["ctc_logp_full_chunk16_left4"]) <= 1e-4


def test_export_then_load_oasr_format(tmp_path, feats, reference):
    out = export_wenet(_make_wenet_dir(tmp_path / "exp"), tmp_path / "oasr")
    assert json.loads((out / "config.json").read_text())["format"] == "oasr"
    model = load_model(out)
    with torch.no_grad():
        enc, _ = model.encoder(feats, torch.tensor([512]), 16, -1)
    assert max_diff(enc[0], reference["enc_full_chunk16_leftall"]) <= 1e-4
    assert model.tokenizer.decode([2, 0, 3]) == "ab"


def test_other_checkpoint_name_is_found(tmp_path, feats, reference):
    exp = _make_wenet_dir(tmp_path / "exp")
    (exp / "final.pt").rename(exp / "avg_10.pt")
    model = load_model(exp)
    with torch.no_grad():
        enc, _ = model.encoder(feats, torch.tensor([512]), -1, -1)
    assert max_diff(enc[0], reference["enc_fullcontext"]) <= 1e-4


def _edit_yaml(exp: Path, fn) -> None:
    conf = yaml.safe_load((exp / "train.yaml").read_text())
    fn(conf)
    (exp / "train.yaml").write_text(yaml.safe_dump(conf))


def test_unsupported_encoder_names_the_supported_one(tmp_path):
    exp = _make_wenet_dir(tmp_path / "exp")
    _edit_yaml(exp, lambda c: c.update(encoder="squeezeformer"))
    with pytest.raises(ValueError, match=r"squeezeformer.*supported encoders: \['conformer'\]"):
        load_model(exp)


def test_non_causal_conformer_is_refused_for_streaming(tmp_path):
    exp = _make_wenet_dir(tmp_path / "exp")
    _edit_yaml(exp, lambda c: c["encoder_conf"].update(causal=False))
    with pytest.raises(ValueError, match="causal: true"):
        load_model(exp)


def test_unsupported_encoder_option_is_named(tmp_path):
    exp = _make_wenet_dir(tmp_path / "exp")
    _edit_yaml(exp, lambda c: c["encoder_conf"].update(layer_norm_type="rms_norm"))
    with pytest.raises(ValueError, match="layer_norm_type='rms_norm'"):
        load_model(exp)


@pytest.mark.parametrize("missing", ["units.txt", "final.pt", "train.yaml"])
def test_missing_file_is_named(tmp_path, missing):
    exp = _make_wenet_dir(tmp_path / "exp")
    (exp / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.split(".")[0] if missing != "final.pt" else r"\.pt"):
        load_model(exp)


def test_missing_cmvn_file_is_named(tmp_path):
    exp = _make_wenet_dir(tmp_path / "exp", with_cmvn_in_ckpt=False)
    (exp / "global_cmvn").unlink()
    with pytest.raises(FileNotFoundError, match="global_cmvn"):
        load_model(exp)


def test_shape_mismatch_names_checkpoint_and_key(tmp_path):
    exp = _make_wenet_dir(tmp_path / "exp")
    _edit_yaml(exp, lambda c: c["encoder_conf"].update(linear_units=512))
    with pytest.raises(ValueError, match=r"final.pt: key encoder.encoders.0.feed_forward.w_1.weight"):
        load_model(exp)


def test_cmvn_in_checkpoint_is_used_even_without_cmvn_in_yaml(tmp_path, feats, reference):
    exp = _make_wenet_dir(tmp_path / "exp")
    _edit_yaml(exp, lambda c: (c.pop("cmvn"), c.pop("cmvn_conf")))
    model = load_model(exp)
    assert model.config.use_global_cmvn
    with torch.no_grad():
        enc, _ = model.encoder(feats, torch.tensor([512]), 16, -1)
    assert max_diff(enc[0], reference["enc_full_chunk16_leftall"]) <= 1e-4


def test_export_command_line(tmp_path, capsys):
    from oasr.models.export import main

    assert main([str(_make_wenet_dir(tmp_path / "exp")), str(tmp_path / "out")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert load_model(tmp_path / "out").units == UNITS


def test_bpe_model_travels_through_export(tmp_path):
    exp = _make_wenet_dir(tmp_path / "exp")
    (exp / "train_unigram30.model").write_bytes(b"spm bytes")
    _edit_yaml(exp, lambda c: c.update(tokenizer_conf={"bpe_path": "/data/lang/train_unigram30.model"}))
    assert load_model(exp).bpe_model == exp / "train_unigram30.model"
    out = export_wenet(exp, tmp_path / "oasr")
    assert (out / "train_unigram30.model").read_bytes() == b"spm bytes"
    assert load_model(out).bpe_model == out / "train_unigram30.model"
