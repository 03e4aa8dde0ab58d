"""The engine's second pass, assembled: the Whisper worker (when ``second_pass`` is on), the
finals publisher in front of it, the refiner of open segments' partials, and the pacing the
engine applies after each step (the worker waits while a live stream is behind real time;
due refinements are submitted)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oasr.engine.live.finals import FinalPublisher
from oasr.engine.live.refine import Refiner
from oasr.engine.second_pass.worker import SecondPassWorker, YieldRule
from oasr.engine.second_pass.jobs import Answer

if TYPE_CHECKING:
    from oasr.engine.config import EngineConfig
    from oasr.engine.request import Request
    from oasr.engine.runner.streams import StreamResources


@dataclass
class SecondPassSide:
    """What the engine holds of its second pass (``finals`` always: with the second pass off
    it publishes the CTC text)."""

    finals: FinalPublisher
    refiner: Refiner | None
    yield_rule: YieldRule | None

    @classmethod
    def build(cls, config: EngineConfig, resources: StreamResources,
              deliver: Callable[[Answer], None]) -> SecondPassSide:
        """The second pass ``config`` asks for, answering through ``deliver`` (the engine's
        ``submit``). Whisper's guard gets the CTC pass's LM setting (its distance check
        needs the LMs)."""
        worker = None
        if config.second_pass == "whisper":
            guard = config.final_guard
            if guard is not None:
                guard = guard.for_first_pass(resources.ctc.decoder.has_lm)
            worker = SecondPassWorker.load(deliver, config.second_pass_max_backlog,
                                           resources.cache_config.device,
                                           config.second_pass_decode_config(), guard,
                                           config.num_threads,
                                           config.second_pass_fast_backlog,
                                           config.second_pass_process, config.second_pass_nice,
                                           config.second_pass_processes)
        timing, tokenizer = resources.family.timing, resources.family.tokenizer
        finals = FinalPublisher(worker, timing, tokenizer, config.final_context_s,
                                config.early_final_s, config.resolved_light_load_streams,
                                config.light_load_context_s, config.sentence_end_s)
        refiner = None
        if worker is not None and config.refine is not None:
            refiner = Refiner(config.refine, worker, timing, tokenizer, finals.next_job_id,
                              finals.known_context)
        return cls(finals, refiner,
                   YieldRule.of(config.second_pass_yield_s, resources.chunk_size, timing))

    def pace(self, requests: dict[int, Request], now: float, engine_busy_s: float) -> None:
        """After a step (that began at ``now``): hold the worker while a live stream is behind
        real time (partials first), and submit the refinements due."""
        worker = self.finals.worker
        if worker is not None and self.yield_rule is not None:
            worker.hold(self.yield_rule.is_behind(requests.values()))
        if self.refiner is not None:
            self.refiner.schedule(requests, now, engine_busy_s)
