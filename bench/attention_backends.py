"""Paged attention per backend: milliseconds of one layer's `paged_attention`, backends
alternated call by call in one process, so both see the same machine load.

The shapes are a Whisper-CTC step's (6 heads of 64, 32-frame chunks in 32-frame blocks):
``--streams`` rows, each holding ``--history`` frames in blocks scattered over the pool (a
third of the rows hold a short last block, so the key mask matters). Prints the median of
``--repeats`` calls per backend and dtype, and the ratio to ``torch`` (the reference).

To see what an AVX2-only CPU would do, run it with the vector width capped::

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python bench/attention_backends.py
"""

from __future__ import annotations

import argparse
import functools
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--streams", type=int, nargs="+", default=[64])
    p.add_argument("--history", type=int, nargs="+", default=[128, 448])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch

    from oasr.benchmarks.timing import alternated_median_ms
    from oasr.fmha import ATTN_BACKENDS, PagedKVCache, paged_attention

    torch.set_num_threads(args.threads)
    heads, dim, chunk = 6, 64, 32
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s), "
          f"median of {args.repeats} calls, backends alternated")
    print("| dtype | streams | history | " + " | ".join(f"{b} ms" for b in ATTN_BACKENDS)
          + " | sdpa vs torch |")
    print("|---|---|---|" + "---|" * len(ATTN_BACKENDS) + "---|")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for streams in args.streams:
            for history in args.history:
                blocks = history // chunk + 1
                gen = torch.Generator().manual_seed(0)
                pool_blocks = streams * blocks + 1
                k_pool = torch.randn(pool_blocks, chunk, heads, dim, generator=gen).to(dtype)
                v_pool = torch.randn(pool_blocks, chunk, heads, dim, generator=gen).to(dtype)
                table = torch.randperm(pool_blocks, generator=gen)[: streams * blocks]
                held = torch.full((streams,), history, dtype=torch.int32)
                held[::3] = history - chunk // 2
                cache = PagedKVCache(k_pool, v_pool, table.view(streams, blocks).int(), held,
                                     chunk, history)
                q = torch.randn(streams, chunk, 3, heads, dim, generator=gen).to(dtype)[:, :, 0]
                ms = alternated_median_ms(
                    {b: functools.partial(paged_attention, q, cache, backend=b)
                     for b in ATTN_BACKENDS}, args.repeats)
                print(f"| {dtype_name} | {streams} | {history} | "
                      + " | ".join(f"{ms[b]:.2f}" for b in ATTN_BACKENDS)
                      + f" | {ms['torch'] / ms['sdpa']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
