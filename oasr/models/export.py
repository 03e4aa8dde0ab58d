"""``python -m oasr.models.export WENET_DIR OUT_DIR``: write oasr's format from a WeNet dir."""

from __future__ import annotations

import argparse
import sys

from oasr.models.wenet import export_wenet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m oasr.models.export",
        description="Convert a WeNet experiment dir (train.yaml, .pt, units.txt, CMVN) "
        "into an oasr model dir (model.safetensors, config.json, units.txt).",
    )
    parser.add_argument("wenet_dir")
    parser.add_argument("out_dir")
    args = parser.parse_args(argv)
    out = export_wenet(args.wenet_dir, args.out_dir)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
