"""Fine-tune Whisper tiny.en's encoder as a chunk-causal streaming CTC model, resumable.

``python -m recipes.whisper_ctc.train`` starts from ``init_from_whisper()`` (or resumes from
``<ckpt>/latest.pt``) and trains on the causal log-mel features of ``recipes.whisper_ctc.feats``:
CTC over the bundled character units, length-bucketed batches, SpecAugment, dynamic chunk
training (chunk_frames drawn from ``chunk_choices`` or full context, unlimited left context
mostly) so chunk-32 serving matches, AdamW with linear warmup then cosine decay, a higher LR for
the fresh CTC head than for the pretrained body, gradient clipping, bfloat16 autocast forward
(about 2x faster than float32 on these CPUs), one torch thread. Every ``ckpt_interval_s`` the
state goes to ``latest.pt`` (atomic) after a quick greedy chunk-32 validation that keeps
``best.pt``; every ``snapshot_interval_s`` a weights-only ``step<N>.pt`` is kept for evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from oasr.models.bundled import BUNDLED_UNITS
from oasr.models.whisper_ctc import WhisperCtcConfig, WhisperCtcModel, init_from_whisper
from oasr.text.tokenizer import CharTokenizer
from oasr.text.wer import ErrorCounts
from recipes.data import Batch, FeatureSet, SpecAugmentConfig
from recipes.paths import DATA_ROOT
from recipes.train_state import TrainState as RunState
from recipes.train_state import resume_latest
from recipes.wer import greedy_ctc
from recipes.whisper_ctc.augment import FeatureAugmentConfig, augmented_batch
from recipes.whisper_ctc.distill import DistillConfig, FullContextTeacher, distilled_forward

UNITS = list(BUNDLED_UNITS)
DATA = DATA_ROOT / "wctc"


@dataclass(frozen=True)
class WctcTrainConfig:
    """Optimisation and bookkeeping settings (recorded in every checkpoint)."""

    max_frames: int = 3200  # padded mel frames per batch (100 per second)
    body_lr: float = 2e-4  # pretrained encoder
    head_lr: float = 2e-3  # fresh CTC head
    warmup_steps: int = 150
    total_steps: int = 4000  # cosine reaches final_lr_ratio here, constant after
    final_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 5.0
    chunk_choices: tuple[int, ...] = (8, 16, 32, 32, 64)  # 32 doubled: the serving chunk
    full_context_prob: float = 0.2
    limited_left_prob: float = 0.15  # else unlimited history; limited: 1..8 chunks
    # The default model's run: fine-tuning every layer fit the TTS voices better but lost ~10
    # WER points on real recordings; freezing the stem and the lower 2 blocks kept them.
    freeze_stem: bool = True
    train_layers: int = 2  # top blocks trained; -1 = all
    bf16: bool = True
    ckpt_interval_s: float = 300.0
    snapshot_interval_s: float = 1500.0
    num_valid_utts: int = 60
    seed: int = 0
    num_threads: int = 1  # one thread is fastest per core on the shared 2-core box
    spec: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    # speaker / recording variety on the stored features (recipes.whisper_ctc.augment); off by default
    augment: FeatureAugmentConfig = field(default_factory=FeatureAugmentConfig)
    # lower blocks trained towards their own full-context outputs (recipes.whisper_ctc.distill); off
    distill: DistillConfig = field(default_factory=DistillConfig)

    def __post_init__(self) -> None:
        if not 0 < self.warmup_steps < self.total_steps:
            raise ValueError(f"need 0 < warmup_steps < total_steps, got {self.warmup_steps}, "
                             f"{self.total_steps}")
        if self.max_frames < 200:
            raise ValueError(f"max_frames {self.max_frames} is below one 2-second utterance")
        if not self.chunk_choices or min(self.chunk_choices) < 1:
            raise ValueError(f"chunk_choices must be positive ints, got {self.chunk_choices}")

    def lr_scale(self, step: int) -> float:
        """Multiplier of both peak LRs at optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        floor = self.final_lr_ratio
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class TrainState(RunState):
    """The shared training state plus when the last step snapshot was kept."""

    last_snapshot_step: int = 0


@dataclass(frozen=True)
class Paths:
    """Where the features come from and where checkpoints and logs go."""

    feats: Path = DATA / "feats"
    ckpt: Path = DATA / "ckpt"
    train_splits: tuple[str, ...] = ("train",)  # pooled into one training set


def sample_chunking(cfg: WctcTrainConfig, rng: np.random.Generator) -> tuple[int, int]:
    """(chunk_frames, left_chunks) of one batch; chunk_frames <= 0 is full context."""
    if rng.random() < cfg.full_context_prob:
        return -1, -1
    chunk = int(cfg.chunk_choices[int(rng.integers(len(cfg.chunk_choices)))])
    left = int(rng.integers(1, 9)) if rng.random() < cfg.limited_left_prob else -1
    return chunk, left


def param_groups(model: WhisperCtcModel, cfg: WctcTrainConfig) -> list[dict]:
    """AdamW groups: head, body matrices (decayed), body vectors (not decayed); frozen parts
    get ``requires_grad=False`` and are left out."""
    frozen: list[torch.nn.Module] = []
    if cfg.freeze_stem:
        frozen += [model.conv1, model.conv2]
    if cfg.train_layers >= 0:
        frozen += list(model.blocks[cfg.distill.layers: len(model.blocks) - cfg.train_layers])
    for module in frozen:
        module.requires_grad_(False)
    head = list(model.ctc.parameters())
    head_ids = {id(p) for p in head}
    body = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
    return [
        {"params": head, "peak_lr": cfg.head_lr, "weight_decay": cfg.weight_decay},
        {"params": [p for p in body if p.dim() > 1], "peak_lr": cfg.body_lr,
         "weight_decay": cfg.weight_decay},
        {"params": [p for p in body if p.dim() <= 1], "peak_lr": cfg.body_lr, "weight_decay": 0.0},
    ]


def ctc_loss(model: WhisperCtcModel, batch: Batch, chunk: int, left: int, bf16: bool,
             teacher: FullContextTeacher | None = None) -> torch.Tensor:
    """Mean CTC loss per utterance of a batch under the (chunk, left) mask; with a ``teacher``,
    (CTC loss, lower-block distillation loss, output KL) stacked into a (3,) tensor."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if teacher is None:
            log_probs, out_lens = model(batch.feats, batch.feat_lens, chunk, left)  # (B, T', V)
        else:
            log_probs, out_lens, lower, kl = distilled_forward(model, teacher, batch.feats,
                                                               batch.feat_lens, chunk, left)
    loss = F.ctc_loss(log_probs.float().transpose(0, 1), batch.targets, out_lens,
                      batch.target_lens, blank=0, reduction="sum", zero_infinity=True)
    loss = loss / batch.feats.size(0)
    return loss if teacher is None else torch.stack([loss, lower, kl])


def train_step(model: WhisperCtcModel, opt: torch.optim.Optimizer, batch: Batch, scale: float,
               cfg: WctcTrainConfig, chunking: tuple[int, int],
               teacher: FullContextTeacher | None = None) -> tuple[float, float, float]:
    """One update; returns (CTC loss per utterance, grad norm, weighted distillation losses
    or 0). Non-finite gradients skip it."""
    for group in opt.param_groups:
        group["lr"] = group["peak_lr"] * scale
    losses = ctc_loss(model, batch, *chunking, cfg.bf16, teacher)
    if teacher is None:
        total, ctc, distill = losses, losses.item(), 0.0
    else:
        extra = cfg.distill.weight * losses[1] + cfg.distill.output_weight * losses[2]
        total = losses[0] + extra
        ctc, distill = losses[0].item(), extra.item()
    opt.zero_grad(set_to_none=True)
    total.backward()
    params = [p for g in opt.param_groups for p in g["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    if torch.isfinite(norm):
        opt.step()
    return ctc, norm.item(), distill


@torch.no_grad()
def validate(model: WhisperCtcModel, valid: FeatureSet, num_utts: int, chunk: int = 32) -> ErrorCounts:
    """Greedy WER of the first ``num_utts`` validation utterances under the chunk mask."""
    model.eval()
    tokenizer = CharTokenizer.from_units(UNITS)
    counts = ErrorCounts()
    indices = list(range(min(num_utts, len(valid))))
    for start in range(0, len(indices), 16):
        part = indices[start:start + 16]
        batch = valid.make_batch(part, None, np.zeros(80, np.float32), np.random.default_rng(0))
        log_probs, lens = model(batch.feats, batch.feat_lens, chunk)
        for k, ids in enumerate(greedy_ctc(log_probs, lens)):
            counts.add(valid.texts[part[k]], tokenizer.decode(ids))
    model.train()
    return counts


def save_checkpoint(path: Path, model: WhisperCtcModel, opt: torch.optim.Optimizer | None,
                    state: TrainState, cfg: WctcTrainConfig) -> None:
    """Atomic write (a killed process leaves the previous file intact); ``opt`` None writes a
    weights-only snapshot."""
    payload = {"model": model.state_dict(), "state": asdict(state), "train_config": asdict(cfg),
               "model_config": model.config.to_dict(), "units": UNITS}
    if opt is not None:
        payload["optimizer"] = opt.state_dict()
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint_model(path: Path) -> tuple[WhisperCtcModel, dict]:
    """(model in eval mode, payload) of a training checkpoint or snapshot."""
    payload = torch.load(path, map_location="cpu", weights_only=False)
    model = WhisperCtcModel(WhisperCtcConfig.from_dict(payload["model_config"]))
    model.load_state_dict(payload["model"])
    return model.eval(), payload


def restore(ckpt_dir: Path, model: WhisperCtcModel, opt: torch.optim.Optimizer) -> TrainState:
    """Resume model, optimizer and data position from ``latest.pt`` when there is one."""
    return resume_latest(ckpt_dir, model, opt, TrainState) or TrainState()


class Trainer:
    """The training loop's state: data, model, optimizer, position, timers."""

    def __init__(self, paths: Paths, cfg: WctcTrainConfig, model: WhisperCtcModel) -> None:
        self.paths, self.cfg, self.model = paths, cfg, model
        paths.ckpt.mkdir(parents=True, exist_ok=True)
        encode = CharTokenizer.from_units(UNITS).encode
        self.train = FeatureSet(paths.feats, paths.train_splits, encode)
        self.valid = FeatureSet(paths.feats, "heldout_sentences", encode)
        self.fill = self.train.array[:: 50].astype(np.float32).mean(axis=0)  # (80,) mask value
        # the teacher copies the starting weights, before a resume replaces them
        self.teacher = (FullContextTeacher(model, cfg.distill.layers,
                                           outputs=cfg.distill.output_weight > 0)
                        if cfg.distill.enabled else None)
        self.opt = torch.optim.AdamW(param_groups(model, cfg), betas=(0.9, 0.98))
        self.state = restore(paths.ckpt, model, self.opt)
        self.batches = self.train.epoch_batches(cfg.max_frames, cfg.seed, self.state.epoch)
        self.window = {"loss": 0.0, "distill": 0.0, "audio": 0.0, "steps": 0, "t": time.time()}

    def next_batch(self) -> tuple[Batch, tuple[int, int]]:
        """The next batch of the epoch order (SpecAugmented) and its chunking."""
        state, cfg = self.state, self.cfg
        if state.batch_in_epoch >= len(self.batches):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            self.batches = self.train.epoch_batches(cfg.max_frames, cfg.seed, state.epoch)
        rng = np.random.default_rng([cfg.seed, state.epoch, state.batch_in_epoch])
        indices = self.batches[state.batch_in_epoch]
        if cfg.augment.is_enabled:
            batch = augmented_batch(self.train, indices, cfg.augment, cfg.spec, self.fill, rng)
        else:  # the default model's run, draw for draw
            batch = self.train.make_batch(indices, cfg.spec, self.fill, rng)
        state.batch_in_epoch += 1
        return batch, sample_chunking(cfg, rng)

    def step(self) -> tuple[float, float]:
        batch, chunking = self.next_batch()
        t0 = time.time()
        loss, norm, distill = train_step(self.model, self.opt, batch,
                                         self.cfg.lr_scale(self.state.step), self.cfg, chunking,
                                         self.teacher)
        self.state.train_seconds += time.time() - t0
        self.state.step += 1
        self.state.audio_seconds += batch.audio_seconds
        self.window["loss"] += loss
        self.window["distill"] += distill
        self.window["audio"] += batch.audio_seconds
        self.window["steps"] += 1
        return loss, norm

    def log(self, norm: float) -> None:
        w, s = self.window, self.state
        elapsed = time.time() - w["t"]
        print(f"{time.strftime('%H:%M:%S')} step {s.step} epoch {s.epoch} "
              f"({s.batch_in_epoch}/{len(self.batches)}) loss {w['loss'] / max(w['steps'], 1):.2f} "
              + (f"distill {w['distill'] / max(w['steps'], 1):.4f} " if self.teacher else "")
              + f"lr x{self.cfg.lr_scale(s.step):.3f} gnorm {norm:.1f} "
              f"{w['audio'] / elapsed:.1f} audio-s/s seen {s.audio_seconds / 3600:.2f} h", flush=True)
        self.window.update(loss=0.0, distill=0.0, audio=0.0, steps=0, t=time.time())

    def checkpoint(self) -> None:
        """Validate, write latest.pt (and best.pt when better), append to history.jsonl."""
        s, ckpt = self.state, self.paths.ckpt
        counts = validate(self.model, self.valid, self.cfg.num_valid_utts)
        improved = counts.wer < s.best_wer
        s.best_wer = min(s.best_wer, counts.wer)
        save_checkpoint(ckpt / "latest.pt", self.model, self.opt, s, self.cfg)
        if improved:
            save_checkpoint(ckpt / "best.pt", self.model, None, s, self.cfg)
        line = {"step": s.step, "epoch": s.epoch, "valid_wer_chunk32": round(counts.wer, 2),
                "valid_cer_chunk32": round(counts.cer, 2),
                "audio_hours_seen": round(s.audio_seconds / 3600, 3),
                "train_hours": round(s.train_seconds / 3600, 3), "time": time.strftime("%H:%M:%S")}
        with open(ckpt / "history.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        print(f"checkpoint {line}{' (best)' if improved else ''}", flush=True)

    def snapshot(self) -> None:
        save_checkpoint(self.paths.ckpt / f"step{self.state.step:06d}.pt", self.model, None,
                        self.state, self.cfg)
        self.state.last_snapshot_step = self.state.step


def run(paths: Paths, cfg: WctcTrainConfig, model: WhisperCtcModel | None = None,
        max_hours: float = 0.0, max_steps: int = 0) -> TrainState:
    """Train until ``max_hours`` of wall time or ``max_steps`` total steps (<= 0: no limit).

    ``model``: used when there is no ``latest.pt`` to resume (default ``init_from_whisper()``).
    """
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    trainer = Trainer(paths, cfg, model if model is not None else init_from_whisper())
    trainer.model.train()
    params = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    print(f"trainable {params / 1e6:.2f}M params; train {len(trainer.train)} utts "
          f"{trainer.train.total_hours:.2f} h; config {json.dumps(asdict(cfg), default=str)}",
          flush=True)
    begin = last_ckpt = last_log = last_snap = time.time()
    while (max_hours <= 0 or time.time() - begin < max_hours * 3600) and (
            max_steps <= 0 or trainer.state.step < max_steps):
        _, norm = trainer.step()
        now = time.time()
        if now - last_log > 60:
            trainer.log(norm)
            last_log = now
        if now - last_snap > cfg.snapshot_interval_s:
            trainer.snapshot()
            last_snap = now
        if now - last_ckpt > cfg.ckpt_interval_s:
            trainer.checkpoint()
            last_ckpt = time.time()
    trainer.checkpoint()
    return trainer.state


def add_augment_args(parser: argparse.ArgumentParser) -> None:
    """SpecAugment and recipes.whisper_ctc.augment flags (defaults: the default model's run)."""
    spec, aug = SpecAugmentConfig(), FeatureAugmentConfig()
    parser.add_argument("--freq-masks", type=int, default=spec.num_freq_masks)
    parser.add_argument("--freq-width", type=int, default=spec.max_freq_width)
    parser.add_argument("--time-masks", type=int, default=spec.num_time_masks)
    parser.add_argument("--time-width", type=int, default=spec.max_time_width)
    parser.add_argument("--warp-prob", type=float, default=aug.warp_prob, help="VTLP mel warp")
    parser.add_argument("--warp-range", type=float, nargs=2, default=(aug.warp_min, aug.warp_max))
    parser.add_argument("--band-limit-prob", type=float, default=aug.band_limit_prob)
    parser.add_argument("--gain-prob", type=float, default=aug.gain_prob)
    parser.add_argument("--max-gain-db", type=float, default=aug.max_gain_db)
    parser.add_argument("--lead-silence-prob", type=float, default=aug.lead_silence_prob)
    parser.add_argument("--trail-silence-prob", type=float, default=aug.trail_silence_prob)
    parser.add_argument("--max-silence-frames", type=int, default=aug.max_silence_frames)
    parser.add_argument("--trim-prob", type=float, default=aug.trim_prob)


def augment_configs(args: argparse.Namespace) -> tuple[SpecAugmentConfig, FeatureAugmentConfig]:
    spec = SpecAugmentConfig(num_freq_masks=args.freq_masks, max_freq_width=args.freq_width,
                             num_time_masks=args.time_masks, max_time_width=args.time_width)
    aug = FeatureAugmentConfig(
        warp_prob=args.warp_prob, warp_min=args.warp_range[0], warp_max=args.warp_range[1],
        band_limit_prob=args.band_limit_prob, gain_prob=args.gain_prob,
        max_gain_db=args.max_gain_db, lead_silence_prob=args.lead_silence_prob,
        trail_silence_prob=args.trail_silence_prob, max_silence_frames=args.max_silence_frames,
        trim_prob=args.trim_prob)
    return spec, aug


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--feats", type=Path, default=Paths.feats)
    parser.add_argument("--ckpt", type=Path, default=Paths.ckpt)
    parser.add_argument("--train-splits", nargs="+", default=list(Paths.train_splits),
                        help="feature splits pooled for training (e.g. train train_digits)")
    parser.add_argument("--threads", type=int, default=WctcTrainConfig.num_threads)
    parser.add_argument("--max-hours", type=float, default=0.0, help="<= 0: run until killed")
    parser.add_argument("--max-steps", type=int, default=0, help="<= 0: no step limit")
    parser.add_argument("--total-steps", type=int, default=WctcTrainConfig.total_steps)
    parser.add_argument("--max-frames", type=int, default=WctcTrainConfig.max_frames)
    parser.add_argument("--body-lr", type=float, default=WctcTrainConfig.body_lr)
    parser.add_argument("--head-lr", type=float, default=WctcTrainConfig.head_lr)
    parser.add_argument("--warmup-steps", type=int, default=WctcTrainConfig.warmup_steps)
    parser.add_argument("--train-layers", type=int, default=WctcTrainConfig.train_layers)
    parser.add_argument("--freeze-stem", action=argparse.BooleanOptionalAction,
                        default=WctcTrainConfig.freeze_stem)
    parser.add_argument("--fp32", action="store_true", help="no bfloat16 autocast")
    parser.add_argument("--seed", type=int, default=WctcTrainConfig.seed)
    parser.add_argument("--snapshot-interval-s", type=float,
                        default=WctcTrainConfig.snapshot_interval_s)
    parser.add_argument("--init-ckpt", type=Path, default=None,
                        help="start from this checkpoint's weights (fresh optimizer and schedule) "
                             "when the run dir has no latest.pt; default init_from_whisper()")
    parser.add_argument("--distill-layers", type=int, default=0,
                        help="lower blocks trained towards their full-context outputs")
    parser.add_argument("--distill-weight", type=float, default=DistillConfig.weight)
    parser.add_argument("--distill-output-weight", type=float, default=0.0,
                        help="KL towards the starting model's full-context posteriors")
    add_augment_args(parser)
    args = parser.parse_args(argv)
    spec, aug = augment_configs(args)
    cfg = WctcTrainConfig(max_frames=args.max_frames, body_lr=args.body_lr, head_lr=args.head_lr,
                          warmup_steps=args.warmup_steps, total_steps=args.total_steps,
                          train_layers=args.train_layers, freeze_stem=args.freeze_stem,
                          bf16=not args.fp32, seed=args.seed, num_threads=args.threads,
                          snapshot_interval_s=args.snapshot_interval_s, spec=spec, augment=aug,
                          distill=DistillConfig(args.distill_layers, args.distill_weight,
                                                args.distill_output_weight))
    model = load_checkpoint_model(args.init_ckpt)[0] if args.init_ckpt is not None else None
    if model is not None:
        print(f"initial weights: {args.init_ckpt}", flush=True)
    run(Paths(args.feats, args.ckpt, tuple(args.train_splits)), cfg, model=model, max_hours=args.max_hours,
        max_steps=args.max_steps)


if __name__ == "__main__":
    main()
