"""One stream's failure ends that stream, never the step: the cohort's allocation and forward,
retried row by row when the batched call fails.

The engine passes what to do with a stream that cannot go on (``on_starved``: end it with
"length"; ``on_failed``: end it with an error); each is called at once, before the next row is
tried, so a stream ended here frees its blocks for the rows after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from oasr.engine.runner.model_runner import BatchPlan, ModelRunner, StepOutput

logger = logging.getLogger(__name__)


def prepare_or_stop(runner: ModelRunner, plan: BatchPlan,
                    on_starved: Callable[[int], None]) -> BatchPlan:
    """Allocate the cohort's blocks in one call; if the pool cannot cover it (a pool sized
    below its slots' needs), give blocks stream by stream and hand the streams that get none
    to ``on_starved``.

    Returns:
        The rows that got their blocks.
    """
    try:
        runner.prepare(plan)  # all-or-nothing: on failure nothing was allocated
        return plan
    except RuntimeError as exc:
        logger.warning("K/V allocation for %d streams failed (%s); allocating one by one",
                       len(plan.stream_ids), exc)
    rows = []
    for row, stream_id in enumerate(plan.stream_ids):
        try:
            runner.prepare(plan.select([row]))
            rows.append(row)
        except RuntimeError:
            on_starved(stream_id)
    return plan.select(rows)


def forward_isolating_failures(
        runner: ModelRunner, plan: BatchPlan,
        on_failed: Callable[[int, Exception], None]) -> tuple[BatchPlan, StepOutput]:
    """One batched forward; if it fails, each row alone, and the rows that fail alone go to
    ``on_failed``.

    Returns:
        The rows that succeeded and their output.
    """
    try:
        return plan, runner.forward(plan)
    except Exception:
        logger.exception("batched forward of %d streams failed; isolating", len(plan.stream_ids))
    rows, outputs = [], []
    for row, stream_id in enumerate(plan.stream_ids):
        try:
            outputs.append(runner.forward(plan.select([row])))
            rows.append(row)
        except Exception as exc:
            logger.exception("forward failed for stream %d", stream_id)
            on_failed(stream_id, exc)
    return plan.select(rows), StepOutput.concat(outputs)
