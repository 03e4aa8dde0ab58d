"""Process-wide settings of a process that runs an engine: torch's intra-op threads and the
host allocator's thresholds.

They change every thread of the process, so no engine constructor applies them: each entry
point (``oasr transcribe``, ``oasr-server``, ``oasr bench`` and the scripts in ``bench/``)
calls `configure_process` once, before it builds an engine. A library user who builds an
`ASREngine` or `EngineThread` directly calls it too; without it the engine gives the same
results on torch's default thread count and re-faults its step buffers each step (slower on
CPU, see ``host_memory.py``).
"""

from __future__ import annotations

import torch

from oasr.engine.runner.host_memory import retain_freed_host_memory


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
