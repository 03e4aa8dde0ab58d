"""What this machine's CPU has that oasr's kernel and dtype rules read: its architecture, its
/proc/cpuinfo flags, and whether it has AMX tiles.

Each rule lives with what it decides and says there why, with its measurements: the dtype
``auto`` picks and the warning for a dtype the CPU emulates (`oasr.engine.families.dtypes`),
bfloat16 linears as one fused oneDNN call (`oasr.models.fused_linear`), torch's fused attention
kernel for the decoder's small query blocks (`oasr.fmha.paged.fused_cpu_attention`), the int8
logits kernels (`oasr.models.whisper.logits.int8_kernels`). This module only asks the machine.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # bfloat16 dot products (else emulated)
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # x86 int8 dot products


def is_x86() -> bool:
    """Whether this is an x86-64 machine."""
    return platform.machine().lower() in ("x86_64", "amd64")


@functools.cache
def flags() -> frozenset[str]:
    """This CPU's /proc/cpuinfo flags (empty where that file cannot be read)."""
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return frozenset()


def has_native_bf16() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX-BF16): from
    /proc/cpuinfo, or where it cannot be read from torch's own CPU query."""
    known = flags()
    if known:
        return any(flag in known for flag in NATIVE_BF16_FLAGS)
    return bool(torch.cpu._is_avx512_bf16_supported() or has_amx_tiles())


def has_int8_dot() -> bool:
    """Whether this x86 CPU has int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or
    AMX-INT8, from /proc/cpuinfo; False where it cannot be read)."""
    return any(flag in flags() for flag in INT8_DOT_FLAGS)


def has_amx_tiles() -> bool:
    """Whether this CPU has AMX tile matrix units (torch's CPU query)."""
    return bool(torch.cpu._is_amx_tile_supported())
