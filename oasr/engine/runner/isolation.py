"""One stream's failure ends that stream, never the step: the cohort's allocation, forward and
decode, retried row by row when the batched call fails.

A chunk changes a stream's state only once all of it succeeded for that stream: the forward
stages its K/V (past the committed frames) and its fixed-extent state (in the output), the
decode of a cohort writes its decoder rows only when its search completes, and
`step_isolating_failures` commits a row (`ModelRunner.commit`) after its decode. A row that
fails is left as it was before the chunk, so a row retried alone after a batched failure
starts from the same state as in the batch, and the other rows' results stand.

The engine passes what to do with a stream that cannot go on (``on_starved``: end it with
"length"; ``on_failed``: end it with an error); each is called at once, before the next row is
tried, so a stream ended here frees its blocks for the rows after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from oasr.engine.runner.model_runner import BatchPlan, ModelRunner, StepOutput

logger = logging.getLogger(__name__)

R = TypeVar("R")
Decode = Callable[[BatchPlan, StepOutput], list[R]]


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


def step_isolating_failures(
        runner: ModelRunner, plan: BatchPlan, decode: Decode[R],
        on_failed: Callable[[int, Exception], None]) -> tuple[BatchPlan, list[R]]:
    """The cohort's chunk: one batched forward, one batched ``decode``, then the commit of
    every row. When the forward fails, each row runs alone (forward, decode, commit); when
    only the decode fails, each row's decode runs alone on its rows of the batched output.
    A row that fails alone goes to ``on_failed`` with its state as before the chunk.

    Args:
        decode: decodes ``output``'s rows for ``plan``'s streams and returns one result per
            row; it must change no stream's decoder state when it raises.
    Returns:
        The rows that succeeded and their results, in row order.
    """
    try:
        output = runner.forward(plan)
    except Exception:
        logger.exception("batched forward of %d streams failed; isolating", len(plan.stream_ids))
        return _row_by_row(runner, plan, decode, on_failed, None)
    try:
        results = decode(plan, output)
    except Exception:
        logger.exception("batched decode of %d streams failed; isolating", len(plan.stream_ids))
        return _row_by_row(runner, plan, decode, on_failed, output)
    runner.commit(plan, output)
    return plan, results


def _row_by_row(runner: ModelRunner, plan: BatchPlan, decode: Decode[R],
                on_failed: Callable[[int, Exception], None],
                output: StepOutput | None) -> tuple[BatchPlan, list[R]]:
    """Each row alone: its forward (or its rows of ``output``), its decode, its commit."""
    rows: list[int] = []
    results: list[R] = []
    for row, stream_id in enumerate(plan.stream_ids):
        one = plan.select([row])
        try:
            mine = runner.forward(one) if output is None else output.select([row])
            result = decode(one, mine)
        except Exception as exc:
            logger.exception("chunk failed for stream %d", stream_id)
            on_failed(stream_id, exc)
            continue
        runner.commit(one, mine)
        rows.append(row)
        results.extend(result)
    return plan.select(rows), results
