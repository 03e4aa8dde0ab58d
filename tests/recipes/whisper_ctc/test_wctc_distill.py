"""Lower-block distillation: exact at full context, CTC gradients kept out, the error falls."""

import numpy as np
import pytest
import torch

from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel
from recipes.whisper_ctc.distill import (
    DistillConfig,
    FullContextTeacher,
    distilled_forward,
    output_kl,
    relative_error,
)
from recipes.whisper_ctc.train import WctcTrainConfig, param_groups

TINY = WhisperCtcConfig(width=32, heads=2, layers=3, max_positions=200)


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 120, 80, generator=g) * 0.3, torch.tensor([120, 90])


def fit(model: WhisperCtcModel, teacher: FullContextTeacher, trained: torch.nn.Module,
        term: int, steps: int = 30) -> list[float]:
    """Adam on ``trained`` against ``distilled_forward``'s output ``term`` at chunk 8; the
    loss of every step."""
    opt = torch.optim.Adam(trained.parameters(), lr=3e-3)
    mel, lens = inputs()
    losses = []
    for _ in range(steps):
        loss = distilled_forward(model, teacher, mel, lens, 8, -1)[term]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_full_context_matches_the_teacher_and_the_model() -> None:
    torch.manual_seed(0)
    model = WhisperCtcModel(TINY).eval()
    teacher = FullContextTeacher(model, 2)
    mel, lens = inputs()
    log_probs, out_lens, loss, kl = distilled_forward(model, teacher, mel, lens, -1, -1)
    assert loss.item() < 1e-10 and kl.item() == 0.0  # the student starts as the teacher
    ref, ref_lens = model(mel, lens, -1)
    torch.testing.assert_close(log_probs, ref)
    assert out_lens.tolist() == ref_lens.tolist() == [60, 45]
    chunked, _ = model(mel, lens, 8)
    log_probs, _, loss, _ = distilled_forward(model, teacher, mel, lens, 8, -1)
    torch.testing.assert_close(log_probs, chunked)
    assert loss.item() > 1e-4  # chunk masking changes the lower blocks' outputs


def test_ctc_gradients_stay_out_of_the_distilled_blocks() -> None:
    torch.manual_seed(0)
    model = WhisperCtcModel(TINY)
    teacher = FullContextTeacher(model, 2)
    mel, lens = inputs()
    log_probs, _, distill, _ = distilled_forward(model, teacher, mel, lens, 8, -1)
    log_probs.sum().backward(retain_graph=True)
    assert all(p.grad is None for p in model.blocks[:2].parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.blocks[2].parameters())
    distill.backward()
    assert all(p.grad is not None for p in model.blocks[:2].parameters())
    assert all(not p.requires_grad for p in teacher.parameters())


def test_distillation_lowers_the_chunked_error() -> None:
    torch.manual_seed(0)
    model = WhisperCtcModel(TINY)
    cfg = WctcTrainConfig(train_layers=1, distill=DistillConfig(layers=2), warmup_steps=1,
                          total_steps=10)
    groups = param_groups(model, cfg)
    trained = {id(p) for g in groups for p in g["params"]}
    assert all(id(p) in trained for p in model.blocks.parameters())  # 2 distilled + 1 top
    assert not any(id(p) in trained for p in model.conv1.parameters())
    teacher = FullContextTeacher(model, 2)
    errors = fit(model, teacher, model.blocks[:2], term=2)
    assert errors[-1] < 0.5 * errors[0], errors[::10]


def test_relative_error_ignores_padding_and_checks_arguments() -> None:
    target = torch.ones(1, 4, 3)
    student = target.clone()
    student[0, 3] = 100.0  # a padded frame
    assert float(relative_error(student, target, torch.tensor([3]))) == 0.0
    student[0, 0] = 0.0
    assert float(relative_error(student, target, torch.tensor([3]))) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        FullContextTeacher(WhisperCtcModel(TINY), 3)
    with pytest.raises(ValueError):
        DistillConfig(layers=-1)
    assert np.isfinite(float(relative_error(target * 0, target * 0, torch.tensor([2]))))


def test_output_distillation_pulls_chunked_posteriors_to_full_context() -> None:
    torch.manual_seed(0)
    model = WhisperCtcModel(TINY)
    teacher = FullContextTeacher(model, 0, outputs=True)
    mel, lens = inputs()
    _, _, lower, kl = distilled_forward(model, teacher, mel, lens, -1, -1)
    assert lower.item() == 0.0 and kl.item() < 1e-8  # full context: the student is the teacher
    kls = fit(model, teacher, model.blocks[1:], term=3)
    assert kls[0] > 1e-4 and kls[-1] < 0.5 * kls[0], kls[::10]
    assert all(not p.requires_grad for p in teacher.parameters())
    with pytest.raises(RuntimeError, match="outputs"):
        FullContextTeacher(model, 1).log_probs(mel, lens)
    with pytest.raises(ValueError):
        FullContextTeacher(model, 0)


def test_output_kl_is_per_utterance_and_ignores_padding() -> None:
    t = torch.log_softmax(torch.randn(2, 5, 4), -1)
    assert output_kl(t, t, torch.tensor([5, 3])).item() == pytest.approx(0.0, abs=1e-6)
    s = t.clone()
    s[1, 4] = torch.log_softmax(torch.randn(4), -1)  # a padded frame of row 1
    assert output_kl(s, t, torch.tensor([5, 3])).item() == pytest.approx(0.0, abs=1e-6)
    s[0, 0] = torch.log(torch.full((4,), 0.25))
    expected = (t[0, 0].exp() * (t[0, 0] - s[0, 0])).sum() / 2
    assert output_kl(s, t, torch.tensor([5, 3])).item() == pytest.approx(expected.item(), rel=1e-5)
    assert DistillConfig(output_weight=0.5).enabled and not DistillConfig().enabled
