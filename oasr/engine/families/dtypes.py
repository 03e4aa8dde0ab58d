"""The engine's dtypes by name, and which one ``dtype="auto"`` picks on this machine."""

from __future__ import annotations

import torch

from oasr import cpu

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
INT8 = "int8"  # int8 Linear weights and activations (`oasr.models.int8`), float32 elsewhere
DTYPE_NAMES = ("auto", *_DTYPES, INT8)
BF16_AUTO_FAMILY = "whisper_ctc"  # the family dtype "auto" runs in bfloat16 on such CPUs


def slow_dtype_reason(name: str, device: torch.device) -> str | None:
    """Why dtype ``name`` (one of `DTYPE_NAMES`) runs slower than float32 on this machine's
    CPU, or None. Measured on a 2-vCPU AVX2-only AMD EPYC (`oasr bench --quick`, one thread,
    64 streams of the bundled model): float32 801 ms a step, bfloat16 5,745 ms (emulated),
    int8 19,281 ms (`torch._int_mm` without VNNI: 4.4 s against 63 ms in float32 for a
    2048 x 512 x 2048 matmul)."""
    if device.type != "cpu" or not cpu.flags():
        return None  # a GPU, or a CPU whose flags cannot be read: nothing to say
    if name == INT8 and cpu.is_x86() and not cpu.has_int8_dot():
        return ("this CPU has no int8 dot-product instructions (no avx512_vnni, avx_vnni or "
                "amx_int8 in /proc/cpuinfo): int8 matmuls run a reference kernel, measured "
                "24x slower than float32 on a 2-vCPU AVX2 EPYC; use --dtype float32")
    if name == "bfloat16" and not cpu.has_native_bf16():
        return ("this CPU has no bfloat16 dot-product instructions (no avx512_bf16 or "
                "amx_bf16 in /proc/cpuinfo): bfloat16 is emulated, measured 3.2-7x slower "
                "than float32; use --dtype auto or float32")
    return None


def resolve_dtype(name: str, device: torch.device, family_name: str | None = None) -> torch.dtype:
    """The float dtype of activations and the K/V pool for dtype ``name`` (one of
    `DTYPE_NAMES`); float32 with "int8".

    "auto": float16 on CUDA; on CPU bfloat16 for a Whisper-CTC model when the CPU
    multiplies bfloat16 natively (`oasr.cpu.has_native_bf16`), else float32. Why: on the
    devset bfloat16 is within 1 WER point of float32 on real and synthetic speech (43.1 /
    16.0 against 43.8 / 16.0 with the char + word LM; 44.4 / 20.8 against 45.1 / 19.8
    with the char LM alone, docs/benchmarks.md), a 64-stream step takes about half the
    CPU time, and the K/V pool half the bytes. int8 ("int8") is about as fast and, with
    the current LM, as accurate, but failed the 1-point rule with the char LM alone, keeps
    the K/V pool in float32, and its partials do not reproduce across batch compositions.
    The Conformer keeps float32 (no trained Conformer to measure accuracy on).

    Args:
        family_name: the model family ("conformer_ctc" | "whisper_ctc"); None = unknown
            (float32 on CPU).
    """
    if name == INT8:
        return torch.float32
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.float16
    if family_name == BF16_AUTO_FAMILY and cpu.has_native_bf16():
        return torch.bfloat16
    return torch.float32
