"""bench/host_work.py's split of a step: host = step minus features, model and decode; the
wrapped functions still return what they return, and their time is counted per step."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the script imports its siblings by name

import host_work  # noqa: E402


def test_host_is_the_step_less_its_named_parts() -> None:
    timer = host_work.StepTimer()
    timer.wall.update(step=1.0, features=0.2, model=0.5, decode=0.1, live=0.05)
    timer.cpu.update(step=0.8, features=0.2, model=0.4)
    timer.end_step()
    wall, cpu = timer.steps[0]
    assert abs(wall["host"] - 0.2) < 1e-12 and abs(cpu["host"] - 0.2) < 1e-12
    assert wall["live"] == 0.05  # inside host, not taken from it again
    assert not timer.wall and not timer.cpu  # the next step starts from zero


def test_a_wrapped_function_returns_its_value_and_counts_each_call() -> None:
    timer = host_work.StepTimer()
    double = timer.wrap("model", lambda x: 2 * x)
    assert double(3) == 6 and double(4) == 8
    assert timer.wall["model"] >= 0.0 and set(timer.wall) == {"model"}
    timer.end_step()
    assert timer.steps[0][0]["host"] == -timer.steps[0][0]["model"]  # no step was wrapped
