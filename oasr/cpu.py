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
from typing import Any

import torch

# the flags that decide which kernels and dtypes are fast here, as benchmark reports name them
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # bfloat16 dot products (else emulated)
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # x86 int8 dot products


def is_x86() -> bool:
    """Whether this is an x86-64 machine."""
    return platform.machine().lower() in ("x86_64", "amd64")


def first_processor(cpuinfo: str) -> dict[str, str]:
    """The first processor's fields of a /proc/cpuinfo text ("model name", "flags", ...)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def _cpuinfo_first() -> dict[str, str]:
    """This machine's `first_processor` (empty where /proc/cpuinfo cannot be read)."""
    try:
        return first_processor(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


def _flags_of(info: dict[str, str]) -> frozenset[str]:
    return frozenset(info.get("flags", "").split())


@functools.cache
def flags() -> frozenset[str]:
    """This CPU's /proc/cpuinfo flags (empty where that file cannot be read)."""
    return _flags_of(_cpuinfo_first())


def describe(info: dict[str, str] | None = None) -> dict[str, Any]:
    """The CPU as a benchmark names it: ``cpu`` (its model name, else the platform's),
    ``cpu_family_model`` (x86's "family F model M", which tells generations apart where the
    name is only "AMD EPYC"; None elsewhere) and ``cpu_features`` (which of `KERNEL_FLAGS`
    it has).

    Args:
        info: a `first_processor` (default: this machine's).
    """
    info = _cpuinfo_first() if info is None else info
    family, model = info.get("cpu family"), info.get("model")
    have = _flags_of(info)
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "cpu_family_model": f"family {family} model {model}" if family and model else None,
        "cpu_features": [flag for flag in KERNEL_FLAGS if flag in have],
    }


def summary(described: dict[str, Any]) -> str:
    """A `describe` in one phrase: "AMD EPYC (family 25 model 17; avx2, avx512f,
    avx512_bf16, avx512_vnni)"."""
    details = [d for d in (described.get("cpu_family_model"),
                           ", ".join(described.get("cpu_features") or [])) if d]
    return described["cpu"] + (f" ({'; '.join(details)})" if details else "")


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
