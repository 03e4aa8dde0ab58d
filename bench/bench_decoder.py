"""Benchmark the streaming CTC decoder: frames decoded per second for many streams at once.

For each beam size it decodes ``--chunks`` chunks of ``--chunk`` frames for ``--streams``
streams, two ways:
- ``decode_streams``: one batch-1 state per stream, each a row of the decoder's persistent
  storage: a call gathers the rows and writes them back (what the engine does);
- ``decode_chunk``: one state holding all rows (the lower bound: no gather / write-back).
The ``stack+split ms`` column is what stacking the streams' states into fresh batch tensors and
splitting them back (the way states that own their tensors are decoded together) costs a step.
Log-probs are random but blank-heavy like a trained CTC model's. Prints a table; ``--json``
writes the numbers.

    PYTHONPATH=. python bench/bench_decoder.py --streams 64 --beams 1 10 --vocab 5000
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
from oasr.decoding.state import split_into, stack_states


def make_log_probs(streams: int, frames: int, vocab: int, device: torch.device) -> torch.Tensor:
    """(streams, frames, vocab) log-probs, blank (id 0) winning about 70% of frames."""
    g = torch.Generator().manual_seed(0)
    logits = 3.0 * torch.randn(streams, frames, vocab, generator=g)
    logits[:, :, 0] += 6.0 * (torch.rand(streams, frames, generator=g) < 0.7)
    return logits.log_softmax(-1).to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()  # as the engine's step decodes
def time_run(args: argparse.Namespace, beam: int, pooled: bool, lp: torch.Tensor) -> float:
    """Seconds to decode every chunk of ``lp`` (after one warm-up pass)."""
    device = lp.device
    dec = GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam), device=device)
    best = float("inf")
    for _ in range(2):  # warm-up, then measured
        if pooled:
            states = [dec.create_state(1, args.vocab) for _ in range(args.streams)]
        else:
            state = dec.create_state(args.streams, args.vocab)
        sync(device)
        start = time.perf_counter()
        for c in range(args.chunks):
            chunk = lp[:, c * args.chunk : (c + 1) * args.chunk]
            if pooled:
                dec.decode_streams(chunk, states)
            else:
                dec.decode_chunk(chunk, state)
        final = dec.partials(states) if pooled else dec.partials([state])
        sync(device)
        best = time.perf_counter() - start
        assert final  # the results are read back, so the timing includes all queued work
    return best


@torch.inference_mode()
def time_stack_split(args: argparse.Namespace, beam: int, device: torch.device) -> float:
    """Milliseconds to stack ``--streams`` batch-1 states into fresh batch tensors and split
    them back (per step; the decoder is thrown away after, its states no longer its rows)."""
    dec = GpuStreamingDecoder(GpuDecoderConfig(beam_size=beam), device=device)
    states = [dec.create_state(1, args.vocab) for _ in range(args.streams)]
    reps = 20
    split_into(stack_states(states), states)
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        split_into(stack_states(states), states)
    sync(device)
    return 1000 * (time.perf_counter() - start) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--chunk", type=int, default=16, help="encoder frames per chunk")
    parser.add_argument("--chunks", type=int, default=25)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="write results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    lp = make_log_probs(args.streams, args.chunk * args.chunks, args.vocab, device)
    frames = args.streams * args.chunk * args.chunks
    rows = []
    for beam in args.beams:
        for pooled in (True, False):
            seconds = time_run(args, beam, pooled, lp)
            rows.append(
                {
                    "beam": beam,
                    "call": "decode_streams" if pooled else "decode_chunk",
                    "streams": args.streams,
                    "vocab": args.vocab,
                    "frames_per_s": frames / seconds,
                    "ms_per_chunk_step": 1000 * seconds / args.chunks,
                    "realtime_streams": frames / seconds * 0.04,  # audio seconds per wall second
                    "stack_split_ms": time_stack_split(args, beam, device) if pooled else 0.0,
                }
            )
    print(
        f"device={device} ({platform.processor() or platform.machine()}), torch "
        f"{torch.__version__}, threads={torch.get_num_threads()}, {args.streams} streams, "
        f"V={args.vocab}, chunk={args.chunk} frames x {args.chunks}"
    )
    print(
        f"{'beam':>4} {'call':<15} {'frames/s':>12} {'ms/step':>9} "
        f"{'x realtime (40 ms frames)':>26} {'stack+split ms':>15}"
    )
    for r in rows:
        print(
            f"{r['beam']:>4} {r['call']:<15} {r['frames_per_s']:>12,.0f} "
            f"{r['ms_per_chunk_step']:>9.2f} {r['realtime_streams']:>26,.0f} "
            f"{r['stack_split_ms']:>15.2f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"device": str(device), "torch": torch.__version__, "rows": rows}, f, indent=2
            )


if __name__ == "__main__":
    main()
