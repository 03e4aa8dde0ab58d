"""WhisperCtcModel: chunk-causal mask, padding independence, output lengths, position limit,
initialisation from Whisper, the oasr model-dir round trip, config validation."""

import json
from pathlib import Path

import pytest
import torch

from oasr.models.bundled import BUNDLED_UNITS
from oasr.models.whisper import load_whisper
from oasr.models.whisper_ctc import (
    WhisperCtcConfig,
    WhisperCtcModel,
    init_from_whisper,
    load_whisper_ctc_dir,
    save_whisper_ctc,
)
from oasr.text.tokenizer import read_units

TINY = WhisperCtcConfig(width=32, heads=2, layers=2, max_positions=200, chunk_frames=4)


def tiny_model(seed: int = 0) -> WhisperCtcModel:
    torch.manual_seed(seed)
    model = WhisperCtcModel(TINY).eval()
    with torch.no_grad():
        model.positions.normal_()
    return model


def mel(frames: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, frames, 80, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("chunk", [1, 4, 8])
def test_a_future_chunk_cannot_change_earlier_frames(chunk: int) -> None:
    model, x = tiny_model(), mel(64)
    cut = 2 * chunk * 2  # first mel frame of encoder chunk 2
    y = x.clone()
    y[:, cut:] = torch.randn(1, 64 - cut, 80)
    lens = torch.tensor([64])
    a, _ = model(x, lens, chunk)
    b, _ = model(y, lens, chunk)
    torch.testing.assert_close(a[:, : 2 * chunk], b[:, : 2 * chunk], atol=1e-5, rtol=0)
    assert (a[:, 2 * chunk:] - b[:, 2 * chunk:]).abs().max() > 1e-3
    full_a, _ = model(x, lens, 0)
    full_b, _ = model(y, lens, 0)
    assert (full_a[:, :chunk] - full_b[:, :chunk]).abs().max() > 1e-3  # full context sees it


def test_left_chunks_bound_the_history() -> None:
    model, x = tiny_model(), mel(48)
    y = x.clone()
    y[:, :4] = torch.randn(1, 4, 80)  # reaches encoder frames 0-3 only (chunk 0)
    lens = torch.tensor([48])
    a, _ = model(x, lens, 4, left_chunks=1)
    b, _ = model(y, lens, 4, left_chunks=1)
    torch.testing.assert_close(a[:, 12:], b[:, 12:], atol=1e-5, rtol=0)  # 2 layers x 1 left chunk: chunks 3+ never see 0
    u, _ = model(x, lens, 4, left_chunks=-1)
    v, _ = model(y, lens, 4, left_chunks=-1)
    assert (u[:, 12:] - v[:, 12:]).abs().max() > 1e-3


def test_padding_cannot_change_a_rows_output() -> None:
    model = tiny_model()
    short, long = mel(30, seed=2), mel(50, seed=3)
    batch = torch.cat([torch.cat([short, 5 * torch.randn(1, 20, 80)], dim=1), long])
    out, lens = model(batch, torch.tensor([30, 50]), 4)
    alone, alone_lens = model(short, torch.tensor([30]), 4)
    assert lens.tolist() == [15, 25] and alone_lens.tolist() == [15]
    torch.testing.assert_close(out[:1, :15], alone, atol=1e-5, rtol=0)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("frames", [2, 7, 33, 64])
def test_t_mel_frames_give_t_over_2_log_prob_frames(frames: int) -> None:
    out, lens = tiny_model()(mel(frames), torch.tensor([frames]), 4)
    assert out.shape == (1, frames // 2, TINY.vocab_size) and out.dtype == torch.float32
    assert lens.tolist() == [frames // 2]
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(1, frames // 2))


def test_more_encoder_frames_than_positions_is_a_value_error() -> None:
    model = tiny_model()
    model(mel(400), torch.tensor([400]), 4)  # 200 frames: exactly the table
    with pytest.raises(ValueError, match="201 encoder frames.*200 positions"):
        model(mel(402), torch.tensor([402]), 4)


def test_init_from_whisper_copies_the_encoder() -> None:
    model = init_from_whisper()
    encoder = load_whisper(device="cpu").model.encoder.state_dict()
    ours = model.state_dict()
    assert set(ours) - set(encoder) == {"ctc.weight", "ctc.bias"}
    for name, value in encoder.items():
        torch.testing.assert_close(ours[name], value, atol=0, rtol=0, msg=name)
    assert model.ctc.weight.shape == (len(BUNDLED_UNITS), 384)
    with pytest.raises(ValueError, match="does not match"):
        init_from_whisper(config=WhisperCtcConfig(layers=2))


def test_save_load_round_trip_in_float16(tmp_path: Path) -> None:
    model = tiny_model()
    out = save_whisper_ctc(model, tmp_path / "m")
    meta = json.loads((out / "config.json").read_text())
    assert meta == {"format": "oasr", "format_version": 1, "model": "whisper_ctc",
                    "config": TINY.to_dict()}
    assert read_units(out / "units.txt") == list(BUNDLED_UNITS)
    loaded = load_whisper_ctc_dir(out)
    assert loaded.units == BUNDLED_UNITS and not loaded.training
    assert loaded.conv1.weight.dtype == torch.float32
    x, lens = mel(40), torch.tensor([40])
    expected, _ = model(x, lens, 4)
    got, _ = loaded(x, lens, 4)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=0)
    assert (got - expected).abs().max() > 0  # really went through float16


def test_loading_another_model_kind_is_refused(tmp_path: Path) -> None:
    out = save_whisper_ctc(tiny_model(), tmp_path / "m")
    meta = json.loads((out / "config.json").read_text())
    meta["model"] = "conformer_ctc"
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="conformer_ctc"):
        load_whisper_ctc_dir(out)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_whisper_ctc_dir(tmp_path)


def test_config_validates_and_round_trips() -> None:
    cfg = WhisperCtcConfig(chunk_frames=16)
    assert WhisperCtcConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.subsampling == 2 and cfg.frame_shift_s == 0.02 and cfg.head_dim == 64
    assert "subsampling" not in cfg.to_dict()
    with pytest.raises(ValueError, match="not divisible"):
        WhisperCtcConfig(width=100, heads=6)
    with pytest.raises(ValueError, match="chunk_frames must be a positive int, got 0"):
        WhisperCtcConfig(chunk_frames=0)
    with pytest.raises(ValueError, match="unknown WhisperCtcConfig keys"):
        WhisperCtcConfig.from_dict({"depth": 3})


def test_a_delta_dir_stores_only_what_differs_from_whisper(tmp_path: Path) -> None:
    model = init_from_whisper().eval()
    with torch.no_grad():  # what fine-tuning the top block and the head changes
        model.blocks[3].qkv.weight.add_(0.01)
        model.ctc.weight.normal_()
    out = save_whisper_ctc(model, tmp_path / "m", delta_from_whisper=True)
    meta = json.loads((out / "config.json").read_text())
    from safetensors.torch import load_file

    stored = set(load_file(str(out / "model.safetensors")))
    assert stored == {"blocks.3.qkv.weight", "ctc.weight", "ctc.bias"}
    assert set(meta["base"]["tensors"]) == set(model.state_dict()) - stored
    loaded = load_whisper_ctc_dir(out)
    for name, value in model.state_dict().items():  # the base tensors exactly, the rest fp16
        torch.testing.assert_close(loaded.state_dict()[name], value,
                                   atol=0 if name not in stored else 1e-2, rtol=0, msg=name)
    meta["base"]["tensors"].append("ctc.weight")  # a head cannot come from Whisper
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="not Whisper's"):
        load_whisper_ctc_dir(out)
