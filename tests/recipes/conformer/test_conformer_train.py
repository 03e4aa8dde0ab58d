"""Training pieces: LR schedule, a real update, atomic checkpoints, resume, fp16 export."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from oasr.models import load_model
from recipes.conformer.export import export
from recipes.conformer.train import (
    UNITS,
    TrainConfig,
    TrainState,
    build_model,
    restore,
    save_checkpoint,
    train_step,
)
from recipes.data import Batch


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    feats = tmp_path / "feats"
    feats.mkdir()
    stats = {"mean_stat": [10.0 * 100] * 80, "var_stat": [(100.0 + 4.0) * 100] * 80,
             "frame_num": 100}
    (feats / "global_cmvn.json").write_text(json.dumps(stats))
    return tmp_path


def tiny_batch() -> Batch:
    gen = torch.Generator().manual_seed(0)
    feats = 10 + 2 * torch.randn(2, 120, 80, generator=gen)
    targets = torch.tensor([[3, 4, 5, 29, 6], [7, 8, 9, 0, 0]])
    return Batch(feats, torch.tensor([120, 100]), targets, torch.tensor([5, 3]), 220)


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    cfg = TrainConfig(peak_lr=1e-3, warmup_steps=10, total_steps=110, final_lr_ratio=0.1)
    assert cfg.lr_at(0) == pytest.approx(1e-4)
    assert cfg.lr_at(9) == pytest.approx(1e-3)
    assert cfg.lr_at(60) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert cfg.lr_at(110) == pytest.approx(1e-4) and cfg.lr_at(10_000) == pytest.approx(1e-4)
    lrs = [cfg.lr_at(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(warmup_steps=100, total_steps=50)


def test_build_model_applies_cmvn_and_updates_reduce_the_loss(data_dir: Path) -> None:
    torch.manual_seed(0)
    model = build_model(data_dir)
    assert torch.allclose(model.encoder.global_cmvn.mean, torch.full((80,), 10.0))
    assert torch.allclose(model.encoder.global_cmvn.istd, torch.full((80,), 0.5))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = TrainConfig(bf16=False)
    batch = tiny_batch()
    model.train()
    losses = [train_step(model, opt, batch, 1e-3, cfg)[0] for _ in range(6)]
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0] * 0.9, losses


def test_checkpoint_resume_restores_weights_optimizer_and_state(tmp_path: Path,
                                                                data_dir: Path) -> None:
    torch.manual_seed(0)
    model = build_model(data_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step(model, opt, tiny_batch(), 1e-3, TrainConfig(bf16=False))
    state = TrainState(step=7, epoch=1, batch_in_epoch=3, audio_seconds=12.5, best_wer=80.0)
    save_checkpoint(tmp_path / "latest.pt", model, opt, state, TrainConfig())
    assert not (tmp_path / "latest.tmp").exists()

    fresh = build_model(data_dir)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    got = restore(tmp_path, fresh, fresh_opt)
    assert got == state
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert fresh_opt.state_dict()["state"][0]["step"] == 1


def test_export_is_small_fp16_and_loads_with_the_same_outputs(tmp_path: Path,
                                                              data_dir: Path) -> None:
    torch.manual_seed(0)
    model = build_model(data_dir).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    save_checkpoint(tmp_path / "best.pt", model, opt, TrainState(step=3), TrainConfig())
    size = export(tmp_path / "best.pt", tmp_path / "out")
    assert size < 20e6
    loaded = load_model(tmp_path / "out")
    assert loaded.units == UNITS
    batch = tiny_batch()
    with torch.no_grad():
        ref, _ = model(batch.feats, batch.feat_lens, 16)
        got, _ = loaded(batch.feats, batch.feat_lens, 16)
    assert (ref - got).abs().max() < 0.05  # fp16 weights, fp32 compute
    info = json.loads((tmp_path / "out" / "training.json").read_text())
    assert info["train_state"]["step"] == 3


def test_clean_indices_pick_only_unaugmented_utterances(tmp_path: Path) -> None:
    from recipes.conformer.train import clean_indices
    from recipes.data import FeatureSet

    feats = tmp_path / "feats"
    feats.mkdir()
    np.save(feats / "train.npy", np.zeros((60, 80), np.float16))
    (feats / "train.tsv").write_text("a\t0\t20\tone two\nb\t20\t20\tthree\nc\t40\t20\tfour\n")
    base = {"tempo": 1.0, "pitch_cents": 0, "reverb": 0, "telephone": False, "via_8k": False,
            "noise": "none"}
    plan = [{"id": "a", "augment": base}, {"id": "b", "augment": {**base, "noise": "pink"}},
            {"id": "c", "augment": {**base, "via_8k": True}}]
    (tmp_path / "plan.jsonl").write_text("\n".join(json.dumps(p) for p in plan) + "\n")
    train = FeatureSet(feats, "train", lambda t: [3] * len(t))
    assert clean_indices(tmp_path, train) == [0]
    assert train.buckets(10_000, subset=[0, 2]) == [[0, 2]]
