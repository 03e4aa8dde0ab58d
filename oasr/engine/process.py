"""Process-wide settings of a process that runs an engine: torch's intra-op threads, the
host allocator's thresholds and the cyclic garbage collector's.

They change every thread of the process, so no engine constructor applies them: each entry
point (``oasr transcribe``, ``oasr-server``, ``oasr bench`` and the scripts in ``bench/``)
calls `configure_process` once, before it builds an engine. A library user who builds an
`ASREngine` or `EngineThread` directly calls it too; without it the engine gives the same
results on torch's default thread count and re-faults its step buffers each step (slower on
CPU, see ``host_memory.py``).
"""

from __future__ import annotations

import gc

import torch

from oasr.engine.runner.host_memory import retain_freed_host_memory

# Container objects allocated (net) before the cyclic collector's youngest generation is
# scanned: CPython's 700 is reached about 60 times a step at 600 streams (events, words,
# partial texts), and every tenth scan also scans the older generation. With 10,000 and the
# start-up objects frozen (`freeze_startup_objects`), 8 steps of 600 streams spent 27 ms in
# the collector against 175-182 ms (one of them a 90 ms full collection), and the median step
# took 672-694 against 726-743 ms (`bench/host_work.py --streams 600`, Xeon AMX, 2 threads).
GC_YOUNG_THRESHOLD = 10_000


def configure_process(num_threads: int | None) -> None:
    """Apply the process-wide settings an engine runs best with.

    Args:
        num_threads: torch intra-op threads for the process (``EngineConfig.num_threads``);
            None keeps torch's default.
    Raises:
        ValueError: ``num_threads`` < 1.
    """
    if num_threads is not None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
        torch.set_num_threads(num_threads)
    retain_freed_host_memory()  # step buffers stay mapped between steps
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def freeze_startup_objects() -> int:
    """Put every object alive now out of the cyclic collector's scans, once the engine is built
    and warmed up: the model's modules, tables and the imported code live as long as the
    process, and a full collection scanned all of them again (90 ms at 600 streams, on the
    engine's thread between two steps). The garbage start-up left is collected first, so it is
    not kept; objects made later are collected as before. Returns the objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
