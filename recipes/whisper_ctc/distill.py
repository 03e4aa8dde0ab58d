"""Streaming the lower encoder blocks without losing what full context gives them.

The lower blocks keep Whisper's pretrained weights (fine-tuning them with CTC on the TTS voices
cost real-speech accuracy), but under the chunk mask they no longer see future frames, and that
alone costs the default model about 5 WER points on the real devset (47.7 % with the LMs; 42.5 %
when only the two lower blocks run with full context). Here the lower ``layers`` blocks learn,
under each batch's chunk mask, to reproduce the outputs that a frozen copy of their starting
weights gives with full context: a target set by Whisper's own representations rather than by
the TTS transcripts, so the blocks adapt to streaming without being pulled towards the synthetic
voices. The CTC loss does not reach them (their output is detached before the upper blocks).

``output_weight`` > 0 adds dual-mode distillation of the outputs: the chunk-masked CTC
posteriors are pulled (KL divergence, summed over frames, per utterance) towards those of a
frozen copy of the whole starting model run with full context, which knows what the future
frames say.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from oasr.models.whisper_ctc import WhisperCtcModel
from oasr.models.whisper_ctc.model import chunk_mask


@dataclass(frozen=True)
class DistillConfig:
    """``layers`` lower blocks trained towards their full-context outputs (0: off);
    ``output_weight`` of the KL towards the full-context model's posteriors (0: off)."""

    layers: int = 0
    weight: float = 1.0
    output_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.layers < 0 or self.weight <= 0 or self.output_weight < 0:
            raise ValueError(f"need layers >= 0, weight > 0, output_weight >= 0, got {self}")

    @property
    def enabled(self) -> bool:
        return self.layers > 0 or self.output_weight > 0


class FullContextTeacher(nn.Module):
    """A frozen copy of a model's lower ``layers`` blocks, run with full context; with
    ``outputs``, also of the whole model (for `log_probs`)."""

    def __init__(self, model: WhisperCtcModel, layers: int, outputs: bool = False) -> None:
        super().__init__()
        if not (0 < layers < len(model.blocks) or (layers == 0 and outputs)):
            raise ValueError(f"layers must be in 1..{len(model.blocks) - 1} (or 0 with outputs), "
                             f"got {layers}")
        self.blocks = copy.deepcopy(model.blocks[:layers]).eval().requires_grad_(False)
        self.whole = copy.deepcopy(model).eval().requires_grad_(False) if outputs else None

    @torch.no_grad()
    def log_probs(self, mel: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
        """(B, T', V) full-context CTC log-probs of the whole starting model."""
        if self.whole is None:
            raise RuntimeError("this teacher was built without outputs=True")
        return self.whole(mel, mel_lengths, -1)[0]

    @torch.no_grad()
    def targets(self, x: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Each block's output (B, T', width) for the first block's input ``x``."""
        mask = chunk_mask(lengths, x.size(1), -1)
        outs = []
        for block in self.blocks:
            x = block(x, mask)
            outs.append(x)
        return outs


def relative_error(student: torch.Tensor, target: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """sum ||student - target||^2 / sum ||target||^2 over the valid frames (scalar float32)."""
    valid = torch.arange(target.size(1), device=lengths.device)[None, :] < lengths[:, None]
    diff = (student.float() - target.float()).pow(2).sum(-1)  # (B, T')
    return diff[valid].sum() / target.float().pow(2).sum(-1)[valid].sum().clamp(min=1e-12)


def output_kl(student: torch.Tensor, teacher: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of (B, T', V) log-probs summed over valid frames, per utterance."""
    valid = torch.arange(teacher.size(1), device=lengths.device)[None, :] < lengths[:, None]
    t = teacher.float()
    kl = (t.exp() * (t - student.float())).sum(-1)  # (B, T')
    return kl[valid].sum() / teacher.size(0)


def distilled_forward(model: WhisperCtcModel, teacher: FullContextTeacher, mel: torch.Tensor,
                      mel_lengths: torch.Tensor, chunk_frames: int, left_chunks: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``model.forward`` plus the distillation losses.

    Returns:
        log_probs (B, T', V) float32, out_lengths (B,), the summed relative error of the
        lower blocks' chunk-masked outputs against the teacher's full-context outputs (0 without
        lower blocks), and `output_kl` against the teacher's full-context posteriors (0 without
        ``teacher.whole``).
    """
    x, lengths = model.embed(mel, mel_lengths)
    targets = teacher.targets(x.detach(), lengths)
    mask = chunk_mask(lengths, x.size(1), chunk_frames, left_chunks)
    loss = x.new_zeros((), dtype=torch.float32)
    for i, block in enumerate(model.blocks):
        x = block(x, mask)
        if i < len(targets):
            loss = loss + relative_error(x, targets[i], lengths)
            if i == len(targets) - 1:
                x = x.detach()  # the CTC loss trains only the blocks above
    log_probs = model.ctc_log_probs(x)
    kl = log_probs.new_zeros(())
    if teacher.whole is not None:
        kl = output_kl(log_probs, teacher.log_probs(mel, mel_lengths), lengths)
    return log_probs, lengths, loss, kl
