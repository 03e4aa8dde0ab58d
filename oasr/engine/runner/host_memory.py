"""Host allocator settings for the engine process: keep freed step buffers instead of
returning them to the kernel.

A batched step allocates and frees the same large tensors every time: at 512 streams of
Whisper-CTC in bfloat16 a layer's gathered keys are 63 MiB, its FFN hidden rows 50 MiB. glibc's
malloc serves a large request with a fresh ``mmap`` (and ``munmap``s it when freed), or trims
freed memory off the heap's top, so each step faults every page of those buffers in again, and
the kernel zeroes each page first. On the 2-core Sapphire Rapids box a (16,384 x 384) @
(384 x 1,536) bfloat16 Linear took 21.9 ms with its output faulted in and 5.8 ms with it reused.

Two settings keep such buffers in the heap, where the next step reuses them:

- ``M_MMAP_MAX`` 0: no request is served by an ``mmap`` of its own, whatever its size (the
  mmap threshold alone stops at 32 MiB on 64-bit glibc);
- ``M_TRIM_THRESHOLD`` 1 GiB: freed memory at the heap's top is given back only beyond that.

One limit stays: a thread other than the main one allocates from an arena made of 64 MiB
heaps, and glibc ``mmap``s a request that does not fit one whatever the settings. The engine
steps on a thread of its own in the server, so its gathered keys and values are kept in a
workspace of their own (`oasr.fmha.paged.GatherWorkspace`) rather than allocated per layer.
Sending every thread to the main arena (``M_ARENA_MAX`` 1) would lift that limit, but the
intra-op threads then wait on one lock for the scratch buffers each attention call allocates
(CPU flash attention 30 % slower, measured).

They are process-wide and change no result. The process's resident memory stays at the
high-water mark of its steps (freed buffers stay mapped for the next step) instead of
dropping between steps. Other platforms keep their allocator as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)

# glibc mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 1 << 30

SETTINGS = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def retain_freed_host_memory() -> bool:
    """Keep this process's freed buffers in glibc's heap (see the module docstring).

    Returns:
        True when every setting was applied (Linux with glibc), False elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = all([mallopt(param, value) == 1 for param, value in SETTINGS])
    if not applied:
        logger.warning("mallopt refused a host allocator setting; step buffers are re-faulted")
    return applied
