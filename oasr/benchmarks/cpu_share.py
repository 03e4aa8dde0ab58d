"""Where a machine's CPU goes during a load run: the CPU seconds of a server process and of each
process below it (the second pass's decoding processes), read from Linux's ``/proc``.

    before = tree_cpu_seconds(pid)
    ...  # the load
    shares = cpu_shares(before, tree_cpu_seconds(pid), seconds)  # pid -> share of one core

Elsewhere than Linux the readings are empty (no ``/proc``), and the shares with them.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` (all its threads), None once gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (every thread's children)."""
    found: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of ``pid`` and of every process below it, by pid."""
    seconds: dict[int, float] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        value = _cpu_seconds(current)
        if value is None or current in seconds:
            continue
        seconds[current] = value
        todo += _children(current)
    return seconds


def cpu_shares(before: dict[int, float], after: dict[int, float], wall_s: float
               ) -> dict[int, float]:
    """Each process's share of one core between two readings ``wall_s`` apart (processes in
    both readings; one that started between them counts from 0)."""
    if wall_s <= 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")
    return {pid: round((after[pid] - before.get(pid, 0.0)) / wall_s, 3) for pid in after}


def pid_with_args(*args: str) -> int | None:
    """The first process whose command line holds ``args`` in a row (e.g. ``--port``, the
    port a server was started with), None when none does."""
    wanted = "\0".join(args).encode()
    for entry in PROC.iterdir() if PROC.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"\0" + wanted + b"\0" in b"\0" + cmdline + b"\0":
            return int(entry.name)
    return None
