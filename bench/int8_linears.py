"""The Whisper-CTC block's linears in int8 on the CPU's int8 matrix units, against the bfloat16
fused linears the engine runs.

For each of the block's linear shapes (QKV 384 -> 1152, FFN up 384 -> 1536 with its GELU, FFN
down 1536 -> 384) at a chunk's rows for ``--streams`` streams (32 encoder frames each):

- *bfloat16 fused*: the engine's call (`oasr.models.fused_linear.linear`: prepacked oneDNN
  weight, bias and GELU inside the matmul);
- *int8*: oneDNN's int8 matmul (``onednn::qlinear_pointwise``, AMX-int8 or VNNI where the CPU
  has them) on the weight quantized per output channel, with the activations quantized per
  tensor first (their absolute maximum, a scale, a rounding: the passes eager torch takes),
  the bias and the GELU inside the matmul, bfloat16 out;
- *int8 matmul alone*: the same call on activations already quantized (what a fused
  quantization would leave);
- *int8 fbgemm*: torch's dynamic int8 linear (``quantized::linear_dynamic``: the activations'
  range and quantization inside the call, VNNI where the CPU has it), float32 in and out, the
  bfloat16 activations cast to float32 and back.

The two oneDNN int8 columns are measured only where `oasr.models.whisper.logits.int8_kernels`
runs oneDNN's int8 product (not on an x86 CPU without AMX, where one call takes seconds).

Freed memory stays in the heap as in the engine (`retain_freed_host_memory`). Median ms of
``--repeats`` calls, the variants alternated.

    python bench/int8_linears.py --streams 64 256 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from oasr.benchmarks.timing import alternated_median_ms

SHAPES = (("qkv", 384, 1152, False), ("ffn up", 384, 1536, True), ("ffn down", 1536, 384, False))
FRAMES_PER_CHUNK = 32  # encoder frames a stream adds per chunk


def variants(rows: int, k: int, n: int, gelu: bool) -> dict[str, Callable[[], object]]:
    """The ways of computing one linear of ``rows`` rows this CPU runs (the module's doc)."""
    from oasr.models.fused_linear import linear
    from oasr.models.whisper.logits import int8_kernels

    torch.manual_seed(0)
    layer = torch.nn.Linear(k, n).to(torch.bfloat16)
    x = torch.randn(rows, k).to(torch.bfloat16)
    weight = layer.weight.detach().float()
    w_scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127
    w_zero = torch.zeros(n, dtype=torch.long)
    bias = layer.bias.detach().float()
    with warnings.catch_warnings():  # torch's quantized tensors are deprecated, not gone
        warnings.simplefilter("ignore", UserWarning)
        q_channels = torch.quantize_per_channel(weight, w_scales, w_zero, 0, torch.qint8)
    dynamic = torch.ops.quantized.linear_prepack(q_channels, bias)

    def int8_fbgemm() -> torch.Tensor:
        out = torch.ops.quantized.linear_dynamic(x.float(), dynamic, True)
        return (F.gelu(out) if gelu else out).to(torch.bfloat16)

    out: dict[str, Callable[[], object]] = {
        "bfloat16 fused": lambda: linear(x, layer, gelu=gelu), "int8 fbgemm": int8_fbgemm}
    if "onednn" not in int8_kernels():
        return out
    q_weight = torch.round(weight / w_scales[:, None]).clamp_(-127, 127).to(torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(q_weight, None)
    post, algorithm = ("gelu", "none") if gelu else ("none", "")

    def int8_matmul(q: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.ops.onednn.qlinear_pointwise(q, scale, 0, packed, w_scales, w_zero, bias,
                                                  1.0, 0, torch.bfloat16, post, [], algorithm)

    def int8() -> torch.Tensor:
        absmax = float(x.abs().amax())
        q = (x * (127 / absmax)).round_().to(torch.int8)
        return int8_matmul(q, absmax / 127)

    absmax = float(x.abs().amax())
    quantized = (x * (127 / absmax)).round_().to(torch.int8)
    return out | {"int8": int8, "int8 matmul alone": lambda: int8_matmul(quantized, absmax / 127)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)

    from oasr import cpu
    from oasr.benchmarks.report import machine_description
    from oasr.engine.runner.host_memory import retain_freed_host_memory

    torch.set_num_threads(args.threads)
    retain_freed_host_memory()
    machine = machine_description(torch.device("cpu"))
    print(f"{cpu.summary(machine)}, {args.threads} thread(s), torch {machine['torch']}, 1-min load "
          f"{os.getloadavg()[0]:.1f}; median ms of {args.repeats} calls")
    columns = ("bfloat16 fused", "int8", "int8 matmul alone", "int8 fbgemm")
    print(f"| streams | rows | linear | {' | '.join(columns)} |")
    print("|---|---|---|" + "---|" * len(columns))
    for streams in args.streams:
        rows = streams * FRAMES_PER_CHUNK
        for name, k, n, gelu in SHAPES:
            with torch.inference_mode():
                ms = alternated_median_ms(variants(rows, k, n, gelu), args.repeats)
            cells = " | ".join(f"{ms[c]:.2f}" if c in ms else "not run" for c in columns)
            print(f"| {streams} | {rows} | {name} ({k} -> {n}) | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
