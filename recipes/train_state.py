"""Where a training run is, for both recipes: the state saved beside the weights in
``latest.pt`` and resuming from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch


@dataclass
class TrainState:
    """Where training is: saved with the weights so a restart continues exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    audio_seconds: float = 0.0
    train_seconds: float = 0.0
    best_wer: float = float("inf")


S = TypeVar("S", bound=TrainState)


def resume_latest(ckpt_dir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
                  state_type: type[S]) -> S | None:
    """Load model, optimizer and training state from ``ckpt_dir/latest.pt``; None without one."""
    latest = ckpt_dir / "latest.pt"
    if not latest.exists():
        return None
    payload = torch.load(latest, map_location="cpu", weights_only=False)
    model.load_state_dict(payload["model"])
    opt.load_state_dict(payload["optimizer"])
    state = state_type(**payload["state"])
    print(f"resumed from {latest} at step {state.step}", flush=True)
    return state
