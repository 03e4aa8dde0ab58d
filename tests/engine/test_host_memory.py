"""The engine's host allocator setting: freed step buffers are reused, not re-faulted."""

from __future__ import annotations

import platform
import resource
import sys

import pytest
import torch

from oasr.engine.host_memory import retain_freed_host_memory


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt thresholds are glibc's")
def test_step_sized_buffers_are_not_refaulted_after_the_setting() -> None:
    assert retain_freed_host_memory()

    def churn() -> None:  # what a step does: big temporaries made, written, freed
        for _ in range(8):
            a = torch.ones(2048, 1536)
            b = a * 2.0
            del a, b

    churn()
    churn()  # warm: the heap has grown to hold the buffers
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    # re-faulting would cost 2 x 8 x 12 MiB / 4 KiB = 6,144 faults; reuse costs ~none
    assert faults < 1000, f"{faults} minor page faults for 16 reused 12 MiB buffers"
