"""What the second pass's logits layout and thread count cost on this CPU.

Whisper's output projection is the tied token embedding (tiny.en: 51864 x 384). A decode
step multiplies a few rows (one per beam, 15 for the fallback ladder) by it; on CPU
`load_whisper` stores the embedding as the transpose of a contiguous (d, V) matrix
(`transpose_embedding_storage`) instead of a contiguous (V, d) one, and
`oasr.models.whisper.logits.LogitsProjection` sends the product through numpy's OpenBLAS (one
thread) where a timing at start finds it faster. This prints, at 1 and 2 torch threads:

- the product alone: torch on both layouts, OpenBLAS on (d, V), and int8 (the weight packed
  for fbgemm, each row's best 64 rescored in float32: the server's default on CPU), for
  1 / 5 / 15 rows (ms, median of ``--repeats``);
- a final's whole decode (beam 5, the live server's setting) of each devset read recording the
  four ways, in turns (s, median over files and repeats), whether the three float32 ways gave
  the same text, and whether int8 gave that text too.

    python bench/whisper_logits.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from oasr.audio import read_audio
from oasr.benchmarks.workload import DEVSET_DIR
from oasr.engine import EngineConfig
from oasr.models.whisper import load_whisper
from oasr.models.whisper.continuous import ContinuousWhisperDecoder
from oasr.models.whisper.logits import LogitsProjection


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


@contextmanager
def embedding_layout(weight: torch.Tensor) -> Iterator[None]:
    """Within: ``weight`` stored contiguous (V, d), as before; (d, V) again after."""
    stored = weight.data
    weight.data = stored.contiguous()
    try:
        yield
    finally:
        weight.data = stored


def decode(decoder: ContinuousWhisperDecoder, audio: torch.Tensor) -> tuple[float, str]:
    start = time.perf_counter()
    decoder.submit(0, audio)
    done: list = []
    while not done:
        done = decoder.step()
    return time.perf_counter() - start, done[0].text


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--devset", type=Path, default=DEVSET_DIR)
    args = parser.parse_args()
    checkpoint = load_whisper(device="cpu")
    decoder = ContinuousWhisperDecoder(checkpoint, EngineConfig().second_pass_decode)
    parameter = checkpoint.model.decoder.embedding.weight
    weight = parameter.detach().contiguous()  # (V, d) row-major
    copy = weight.t().contiguous()  # (d, V) row-major: what the model stores on CPU
    files = sorted(args.devset.glob("real_*.wav"))
    audios = [read_audio(f) for f in files]
    projection = checkpoint.model.decoder.logits
    blas = LogitsProjection(parameter, "blas")
    int8 = LogitsProjection(parameter, "int8")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows in (1, 5, 15):
            x = torch.randn(rows, 1, weight.size(1))
            row_major = median_ms(lambda x=x: F.linear(x, weight), args.repeats)
            vocab_major = median_ms(lambda x=x: x @ copy, args.repeats)
            openblas = median_ms(lambda x=x: blas(x), args.repeats)
            quantized = median_ms(lambda x=x: int8(x), args.repeats)
            print(f"threads {threads}, {rows:2d} rows: torch (V, d) {row_major:5.1f} ms, "
                  f"torch (d, V) {vocab_major:5.1f} ms, OpenBLAS (d, V) {openblas:5.1f} ms, "
                  f"int8 {quantized:5.1f} ms")
        names = ("(V, d)", "(d, V)", "OpenBLAS", "int8")
        backends = {"(V, d)": "torch", "(d, V)": "torch", "OpenBLAS": "blas", "int8": "int8"}
        times: dict[str, list[float]] = {name: [] for name in names}
        same = same_int8 = 0
        for audio in audios:
            texts: dict[str, set[str]] = {"float32": set(), "int8": set()}
            for _ in range(args.repeats):
                for name in names:
                    projection.backend = backends[name]
                    if name == "(V, d)":
                        with embedding_layout(parameter):
                            seconds, text = decode(decoder, audio)
                    else:
                        seconds, text = decode(decoder, audio)
                    times[name].append(seconds)
                    texts["int8" if name == "int8" else "float32"].add(text)
            same += len(texts["float32"]) == 1
            same_int8 += texts["int8"] == texts["float32"]
        projection.backend = EngineConfig().second_pass_decode.logits
        medians = ", ".join(f"{name} {statistics.median(v):.3f} s" for name, v in times.items())
        print(f"threads {threads}, final decode of {len(audios)} devset recordings (torch "
              f"unless named): {medians}; float32 the same text all three ways in "
              f"{same}/{len(audios)}, int8 the same as float32 in {same_int8}/{len(audios)}",
              flush=True)

if __name__ == "__main__":
    main()
