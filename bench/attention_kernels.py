"""A Whisper-CTC layer's attention at a real-time width, per kernel torch offers on this CPU,
against a linear of the same rows: what the attention's matmuls reach, and why.

Each stream's 32 queries attend over its 160 keys (4 chunks of history plus the chunk), 6
heads of 64, already gathered (B, H, T, D) as the engine's paged gather leaves them. The
variants compute the same attention:

- *sdpa bfloat16*: ``scaled_dot_product_attention`` (torch's CPU flash kernel), what the
  engine runs; *sdpa float16*, *sdpa float32*: the same kernel in those dtypes;
- *matmuls + softmax*: the scores' batched matmul, a softmax, the weighted sum's matmul, in
  bfloat16;
- *flex, compiled* (``--flex``): ``flex_attention`` through ``torch.compile`` (inductor's CPU
  template), compiled once before the timing;
- *FFN down linear*: the block's 1,536 -> 384 linear on the same streams' 32 rows each
  (`oasr.models.fused_linear.linear`), the matrix units at work on the step's larger products.

Then the served kernel with each stream's queries padded to ``--query-lengths`` (does a longer
query block reach a faster path?). GFLOP/s counts 4 B H T L D for an attention (the two
matmuls) and 2 rows K N for the linear. Median ms of ``--repeats`` calls, the variants
alternated.

With ``--lone``, also the second pass's decoder attention: ``--lone`` rows (segments) of a
lone query (a greedy row's next token) or 5 (a beam's), 6 heads of 64, over 100 keys (its own
tokens) or 704 and 1,500 (encoder frames), through the fused kernel and through the matmuls
and softmax, in bfloat16 and float32: `oasr.fmha.paged.fused_cpu_attention` picks one of the
two per CPU.

    python bench/attention_kernels.py --streams 64 640 --threads 2 --flex
    python bench/attention_kernels.py --streams 64 --threads 1 --lone 8 16 --query-lengths
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from oasr.benchmarks.timing import alternated_median_ms

HEADS, HEAD_DIM, QUERIES, KEYS = 6, 64, 32, 160  # a steady Whisper-CTC chunk's attention


def attention_flop(streams: int, queries: int = QUERIES) -> float:
    """FLOPs of one layer's attention matmuls (scores and weighted sum)."""
    return 4.0 * streams * HEADS * queries * KEYS * HEAD_DIM


def variants(streams: int, flex: bool = False) -> dict[str, Callable[[], torch.Tensor]]:
    """The attention variants (see the module's doc), each returning (B, H, T, D)."""
    gen = torch.Generator().manual_seed(0)
    shape_q, shape_kv = (streams, HEADS, QUERIES, HEAD_DIM), (streams, HEADS, KEYS, HEAD_DIM)
    q32, k32, v32 = (torch.randn(s, generator=gen) for s in (shape_q, shape_kv, shape_kv))
    typed = {dtype: (q32.to(dtype), k32.to(dtype), v32.to(dtype))
             for dtype in (torch.bfloat16, torch.float16, torch.float32)}
    q, k, v = typed[torch.bfloat16]
    scale = HEAD_DIM ** -0.5

    def matmuls() -> torch.Tensor:
        scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (B, H, T, L)
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    calls: dict[str, Callable[[], torch.Tensor]] = {
        f"sdpa {str(dtype).removeprefix('torch.')}":
            (lambda t=tensors: F.scaled_dot_product_attention(*t))
        for dtype, tensors in typed.items()}
    calls["matmuls + softmax"] = matmuls
    if flex:
        from torch.nn.attention.flex_attention import flex_attention

        compiled = torch.compile(flex_attention, dynamic=False)
        calls["flex, compiled"] = lambda: compiled(q, k, v)  # type: ignore[no-any-return]
    return calls


def ffn_down(streams: int) -> Callable[[], torch.Tensor]:
    """The block's FFN down linear (1,536 -> 384, residual added) on ``streams`` chunks."""
    from oasr.models.fused_linear import linear

    layer = torch.nn.Linear(4 * HEADS * HEAD_DIM, HEADS * HEAD_DIM).to(torch.bfloat16)
    x = torch.randn(streams * QUERIES, layer.in_features).to(torch.bfloat16)
    residual = torch.randn(streams * QUERIES, layer.out_features).to(torch.bfloat16)
    return lambda: linear(x, layer, residual=residual)


def padded_queries(streams: int, lengths: list[int]) -> dict[str, Callable[[], torch.Tensor]]:
    """The served kernel (bfloat16 sdpa) with each stream's queries padded to each length."""
    calls: dict[str, Callable[[], torch.Tensor]] = {}
    k = torch.randn(streams, HEADS, KEYS, HEAD_DIM).to(torch.bfloat16)
    v = torch.randn(streams, HEADS, KEYS, HEAD_DIM).to(torch.bfloat16)
    for length in lengths:
        q = torch.randn(streams, HEADS, length, HEAD_DIM).to(torch.bfloat16)
        calls[str(length)] = lambda q=q: F.scaled_dot_product_attention(q, k, v)
    return calls


def decoder_queries(rows: int, queries: int, keys: int, dtype: torch.dtype
                    ) -> dict[str, Callable[[], torch.Tensor]]:
    """The decoder's attention of ``rows`` x ``queries`` over ``keys``: fused and matmuls."""
    from oasr.fmha.paged import _unmasked_attention

    q = torch.randn(rows, HEADS, queries, HEAD_DIM).to(dtype)
    k = torch.randn(rows, HEADS, keys, HEAD_DIM).to(dtype)
    v = torch.randn(rows, HEADS, keys, HEAD_DIM).to(dtype)
    return {"fused": lambda: F.scaled_dot_product_attention(q, k, v),
            "matmuls": lambda: _unmasked_attention(q, k, v, HEAD_DIM ** -0.5)}


def lone_table(rows: list[int], repeats: int) -> None:
    """Print the decoder's small query blocks' table (``--lone``)."""
    print("\n| dtype | rows x queries | keys | fused ms | matmuls ms | fused / matmuls |")
    print("|---|---|---|---|---|---|")
    for dtype in (torch.bfloat16, torch.float32):
        for num_rows in rows:
            for queries, keys in ((1, 100), (1, 704), (1, 1500), (5, 1500)):
                with torch.inference_mode():
                    ms = alternated_median_ms(decoder_queries(num_rows, queries, keys, dtype),
                                              repeats)
                print(f"| {str(dtype).removeprefix('torch.')} | {num_rows} x {queries} | {keys} "
                      f"| {ms['fused']:.2f} | {ms['matmuls']:.2f} "
                      f"| {ms['fused'] / ms['matmuls']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[64, 640])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--flex", action="store_true",
                        help="also time flex_attention through torch.compile (a compile first)")
    parser.add_argument("--query-lengths", type=int, nargs="*", default=[32, 48, 64, 128],
                        help="queries per stream and head for the padded-query table")
    parser.add_argument("--lone", type=int, nargs="*", default=[],
                        help="also the decoder's lone and beam queries for these many rows")
    args = parser.parse_args(argv)

    from oasr import cpu
    from oasr.benchmarks.report import machine_description
    from oasr.engine.runner.host_memory import retain_freed_host_memory

    torch.set_num_threads(args.threads)
    retain_freed_host_memory()
    machine = machine_description(torch.device("cpu"))
    print(f"{cpu.summary(machine)}, {args.threads} thread(s), torch {machine['torch']}, 1-min load "
          f"{os.getloadavg()[0]:.1f}; median ms of {args.repeats} calls; {QUERIES} queries over "
          f"{KEYS} keys, {HEADS} heads of {HEAD_DIM}")
    print("| streams | variant | ms | GFLOP/s |")
    print("|---|---|---|---|")
    for streams in args.streams:
        calls: dict[str, Callable[[], object]] = dict(variants(streams, args.flex))
        calls["FFN down linear"] = ffn_down(streams)
        with torch.inference_mode():
            ms = alternated_median_ms(calls, args.repeats)
        linear_flop = 2.0 * streams * QUERIES * 4 * (HEADS * HEAD_DIM) ** 2
        for name, value in ms.items():
            flop = linear_flop if name == "FFN down linear" else attention_flop(streams)
            print(f"| {streams} | {name} | {value:.2f} | {flop / value / 1e6:.0f} |")
    if args.query_lengths:
        print("\n| streams | queries per stream | ms | GFLOP/s |")
        print("|---|---|---|---|")
        for streams in args.streams:
            with torch.inference_mode():
                ms = alternated_median_ms(dict(padded_queries(streams, args.query_lengths)), args.repeats)
            for length, value in ms.items():
                flop = attention_flop(streams, int(length))
                print(f"| {streams} | {length} | {value:.2f} | {flop / value / 1e6:.0f} |")
    if args.lone:
        lone_table(args.lone, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
