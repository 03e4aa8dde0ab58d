"""Stage 6: a training checkpoint -> oasr's model format (float16 weights), the bundled model.

Writes ``model.safetensors`` (every floating tensor as float16 except the CMVN statistics,
which stay float32; ``load_model`` casts back to the model's dtype), ``config.json``,
``units.txt`` and ``training.json`` (provenance: step, audio hours seen, validation WER, and
the evaluation report when one is given).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from oasr.models import save_model
from oasr.models.checkpoint import DEFAULT_MODEL_DIR, WEIGHTS_FILE
from recipes.conformer.evaluate import load_for_eval
from recipes.paths import DATA_ROOT

KEEP_FLOAT32 = ("global_cmvn.",)


def export(ckpt: Path, out_dir: Path, eval_report: Path | None = None) -> int:
    """Export ``ckpt`` into ``out_dir``; returns the weight file's size in bytes."""
    model, train_state = load_for_eval(ckpt)
    save_model(model, out_dir)
    state = {}
    for key, value in model.state_dict().items():
        value = value.detach().cpu().contiguous()
        if value.is_floating_point() and not any(k in key for k in KEEP_FLOAT32):
            value = value.to(torch.float16)
        state[key] = value
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "oasr"})
    info = {"checkpoint": str(ckpt), "train_state": train_state,
            "num_parameters": sum(p.numel() for p in model.parameters())}
    if eval_report is not None and eval_report.exists():
        info["evaluation"] = json.loads(eval_report.read_text())
    (out_dir / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    return (out_dir / WEIGHTS_FILE).stat().st_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", type=Path, nargs="?", default=DATA_ROOT / "ckpt/best.pt")
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--eval-report", type=Path, default=None)
    args = parser.parse_args(argv)
    size = export(args.ckpt, args.out, args.eval_report)
    print(f"exported {args.ckpt} -> {args.out} ({size / 1e6:.2f} MB weights)")


if __name__ == "__main__":
    main()
