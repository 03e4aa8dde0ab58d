"""Process-wide settings: applied by the entry points (``configure_process``), never by an
engine's constructor; the host allocator setting reuses freed step buffers; the garbage
collector's threshold and the start-up objects' freeze."""

from __future__ import annotations

import gc
import platform
import resource
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from oasr.engine import ASREngine, EngineConfig, configure_process
from oasr.engine.process import GC_YOUNG_THRESHOLD
from oasr.engine.runner.host_memory import retain_freed_host_memory
from oasr.engine.second_pass.worker import second_pass_threads


@pytest.fixture
def torch_threads() -> Iterator[int]:
    """torch's intra-op thread count for the test, put back afterwards."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_building_an_engine_leaves_the_process_threads_alone(
        engine_config: EngineConfig, torch_threads: int) -> None:
    torch.set_num_threads(2)
    ASREngine(replace(engine_config, num_threads=1))
    assert torch.get_num_threads() == 2


@pytest.fixture
def gc_threshold() -> Iterator[tuple[int, ...]]:
    """The collector's thresholds for the test, put back afterwards."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_configure_process_sets_the_threads(torch_threads: int,
                                            gc_threshold: tuple[int, ...]) -> None:
    gc.set_threshold(700, 10, 10)
    configure_process(1)
    assert torch.get_num_threads() == 1
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)
    configure_process(None)  # None keeps what the process has
    assert torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        configure_process(0)


@pytest.mark.parametrize(("engine", "worker"), [(1, 1), (2, 1), (4, 2), (8, 4), (64, 4)])
def test_the_second_pass_thread_takes_half_the_engine_threads(engine: int, worker: int) -> None:
    assert second_pass_threads(engine) == worker


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


# A step's large buffers at scale, made and freed on a thread of its own as the engine's step
# is: past glibc's 32 MiB mmap threshold, within a thread arena's 64 MiB heaps.
_THREAD_CHURN = textwrap.dedent("""
    import resource, sys, threading, torch
    from oasr.engine.runner.host_memory import retain_freed_host_memory
    if sys.argv[1] == "set":
        assert retain_freed_host_memory()
    def churn():
        for _ in range(4):
            a = torch.ones(40 << 20 >> 2)  # 40 MiB of float32
            b = a * 2.0
            del a, b
    faults = []
    def step():
        churn(); churn()  # warm
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        churn()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    thread = threading.Thread(target=step)
    thread.start(); thread.join()
    print(faults[0])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt settings are glibc's")
def test_buffers_past_the_mmap_threshold_are_reused_on_the_engines_thread() -> None:
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _THREAD_CHURN, mode], check=True,
                             capture_output=True, text=True, timeout=120)
        return int(out.stdout.split()[-1])

    # 2 x 4 x 40 MiB faulted in again = 81,920 pages of 4 KiB (fewer with huge pages)
    assert faults("default") > 10_000
    assert faults("set") < 2_000


# In a process of its own: a freeze holds for the rest of the process.
_FREEZE = textwrap.dedent("""
    import gc, weakref
    from oasr.engine import freeze_startup_objects
    class Node: pass
    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)
    gc.disable()  # no collection but the ones asked for
    startup_garbage = cycle()  # unreachable already: collected before the freeze, not kept
    kept = Node()
    frozen = freeze_startup_objects()
    later_garbage = cycle()
    assert startup_garbage() is None
    assert frozen == gc.get_freeze_count() > 1000
    assert gc.is_tracked(kept) and not any(o is kept for o in gc.get_objects())  # not scanned
    found = gc.collect()  # what start-up left is not scanned; later cycles still are
    assert later_garbage() is None and found >= 2, found
    print(frozen, found)
""")


def test_freezing_the_startup_objects_keeps_collecting_later_garbage() -> None:
    out = subprocess.run([sys.executable, "-c", _FREEZE], check=True, capture_output=True,
                         text=True, timeout=120)
    frozen, found = map(int, out.stdout.split())
    assert frozen > 1000 and found >= 2
