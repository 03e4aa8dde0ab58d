"""StreamResources: the engine's model, caches and decoder, addressed by stream id.

One object owns everything a stream holds while it runs (a slot, K/V blocks, its rows of the
model family's fixed-extent state, its decoder row) so the engine can open, reset and close a
stream in one call and its step reads as policy, not bookkeeping. The slot comes from one
``StreamSlotPool`` owned here and is passed to every manager, so a stream is the same row in the
block table, the state cache and the decoder's storage. A family without paged K/V
(``streaming_kind = "slot"``: the Zipformer's slot runtime) gets no block pool. The state
cache holds whatever the model's encoder declares; its persistent states are written here at
admission, from the model's ``stream_conditioning``, and kept through resets.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from oasr import cpu
from oasr.cache import (
    AttentionCacheManager,
    BlockPool,
    CacheConfig,
    CtcStateCacheManager,
    SlotStateCache,
    StreamSlotPool,
)
from oasr.decoding import (
    CharTokenizer,
    EndpointConfig,
    EndpointDecision,
    Endpointer,
    EndpointRule,
    FrameStats,
    GpuStreamingDecoder,
    Hypothesis,
)
from oasr.decoding.context import ContextGraph
from oasr.decoding.decoder import WORD_BOUNDARY
from oasr.engine.config import EngineConfig
from oasr.engine.families import ModelFamily, family_for
from oasr.engine.families.dtypes import slow_dtype_reason
from oasr.engine.runner.capacity import check_pool_covers_slots
from oasr.engine.runner.graphs import CudaGraphBackend
from oasr.engine.runner.memory import cache_config_for
from oasr.engine.runner.model_runner import ModelRunner, StepOutput
from oasr.engine.runner.padding import StepPadding, WidthLadder
from oasr.engine.runner.transducer import TransducerStreams
from oasr.lm import DecoderLm, load_decoder_lm
from oasr.models import load_model
from oasr.models.checkpoint import DEFAULT_MODEL_DIR

logger = logging.getLogger(__name__)


@dataclass
class StreamResources:
    """Model family + cache managers + decoder of one engine.

    Invariant: a stream id is known to the attention manager (paged families), the family's
    state cache and the decoder's states (CTC, or the transducer's) at once, from
    `open_stream` to `close_stream`, under the one slot ``slots`` allocated for it.
    """

    config: EngineConfig
    family: ModelFamily
    cache_config: CacheConfig
    pool: BlockPool | None
    attention: AttentionCacheManager | None
    states: SlotStateCache
    slots: StreamSlotPool
    ctc: CtcStateCacheManager[GpuStreamingDecoder]
    runner: ModelRunner
    endpointer: Endpointer | None
    transducer: TransducerStreams | None = None
    # this runtime writes a model's persistent (per-request) states at admission, from the
    # model's stream_conditioning (`open_stream`); a runtime that cannot is refused such a
    # model at construction (`check_encoder_conditioning`)
    carries_encoder_conditioning: ClassVar[bool] = True
    # the most encoder frames one segment decodes: the engine ends a segment before a chunk
    # would pass it (`segment_frame_limit`; None: the K/V ceiling ends the stream first)
    max_segment_frames: int | None = None

    @classmethod
    def build(cls, config: EngineConfig, model: nn.Module | None = None) -> StreamResources:
        """Load the model (unless given), pick its family and preallocate every pool.

        Raises:
            ValueError: a chunk longer than the model's position limit; a pool too small for
                its slots (`check_pool_covers_slots`).
        """
        device = config.resolve_device()
        given = model is not None
        if model is None:
            chunk, left = _icefall_decode_setting(config)
            model = load_model(config.model, chunk_size=chunk, left_context_frames=left)
        family_name = family_for(model).name
        dtype = config.resolve_dtype(device, family_name)
        int8 = config.int8_linears
        slow = slow_dtype_reason(config.dtype, device)
        if slow is not None:
            logger.warning("dtype %s: %s", config.dtype, slow)
        if given and (int8 or next(model.parameters()).dtype != dtype):
            model = copy.deepcopy(model)  # casting or quantizing in place would change (and
            # round) the caller's model
        model = model.to(device=device, dtype=dtype).eval()
        family = family_for(model)
        if int8:
            family.quantize_int8()
        family.prepare_for_serving()  # after the cast and int8: what the first chunk would do
        chunk = config.resolve_chunk_size(family.default_chunk_size)
        limit = family.max_positions
        if limit is not None and chunk > limit:
            raise ValueError(f"chunk_size {chunk} exceeds the model's {limit} positions")
        cache_config = cache_config_for(config, family.kv_geometry(), device, dtype, chunk,
                                        max_stream_frames=limit)
        if family.paged_kv:
            check_pool_covers_slots(cache_config)
        lanes = 1 if config.resolve_pad_cohorts(device) else 0  # the padding lane (padding.py)
        pool = BlockPool(cache_config, scratch_blocks=lanes) if family.paged_kv else None
        attention = None if pool is None else AttentionCacheManager(pool, cache_config, lanes)
        states = family.build_states(cache_config, lanes)
        check_encoder_conditioning(family, states, cls.carries_encoder_conditioning)
        lm = decoder_lm(config, family.tokenizer, device)
        max_segment = segment_frame_limit(config, family, cache_config)
        # the decoder's rows (one per slot) and token buffers, allocated now for good
        decoder = GpuStreamingDecoder(
            config.decoder, family.tokenizer, device=device, lm=lm,
            rows=cache_config.max_batch_size,
            max_segment_frames=decoded_frame_limit(max_segment, family, cache_config))
        ctc = CtcStateCacheManager(decoder)
        runner = ModelRunner(family, attention, states, device, dtype,
                             _step_padding(family, cache_config) if lanes else None)
        if config.resolve_cuda_graphs(device):
            runner.enable_graphs(CudaGraphBackend(device))
        transducer = _transducer_streams(family, config)
        endpointer = None
        if config.endpoint is not None:  # rules in seconds, counted in this model's frames
            endpointer = Endpointer(dataclasses.replace(
                config.endpoint, frame_shift_s=family.timing.frame_shift_s),
                separator_ids=_separator_ids(family.tokenizer))
        if device.type == "cpu":
            logger.info("engine: CPU %s", cpu.summary(cpu.describe()))
        logger.info(
            "engine: %s (%s) on %s/%s%s, %d slots, chunk %d frames, %d blocks of %d frames "
            "(%.1f MiB K/V), per-stream ceiling %d frames, beam %d, LM: %s%s",
            type(model).__name__, family.name, device, dtype,
            " + int8 linears" if int8 else "",
            cache_config.max_batch_size,
            chunk, 0 if pool is None else cache_config.max_num_blocks,
            cache_config.block_size_frames, 0.0 if pool is None else pool.nbytes / 2**20,
            cache_config.max_stream_frames,
            config.decoder.beam_size,
            "none" if lm is None else (f"{lm!r}, weight {decoder.config.lm_weight}, "
                                       f"word weight {decoder.config.word_lm_weight}"),
            "" if transducer is None else " (transducer: 1 = greedy, else modified beam search)",
        )
        return cls(config, family, cache_config, pool, attention, states,
                   StreamSlotPool(cache_config.max_batch_size), ctc, runner, endpointer, transducer,
                   max_segment)

    @property
    def model(self) -> nn.Module:
        return self.family.model

    @property
    def chunk_size(self) -> int:
        """Encoder frames per chunk (the config's, or the model's trained chunk)."""
        return self.cache_config.chunk_size

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        return self.slots.num_free_slots

    def open_stream(self, stream_id: int) -> int:
        """Allocate the stream's slot and give it zeroed caches and a fresh decoder state there.

        Raises:
            ValueError: the stream id is already open.
            RuntimeError: no free slot, or no room for a prefilled K/V window (nothing is kept).
        """
        if stream_id in self.states:
            raise ValueError(
                f"stream {stream_id} is already allocated (slot {self.states.slot_of(stream_id)})")
        slot = self.slots.allocate()
        try:
            if self.attention is not None:
                self.attention.allocate_stream(stream_id, slot)
            self.states.allocate_stream(stream_id, slot)
            self._write_conditioning(stream_id)
            if self.transducer is not None:
                self.transducer.allocate_stream(stream_id)
            else:
                self.ctc.allocate_stream(stream_id, 1, self.family.vocab_size, slot=slot)
        except BaseException:
            self._release(stream_id)
            self.slots.free(slot)
            raise
        return slot

    def _write_conditioning(self, stream_id: int) -> None:
        """The stream's persistent states (zeroed by the allocation) get the values the
        model's ``stream_conditioning`` gives for it; a reset keeps them.

        Raises:
            ValueError: values for states that are not declared persistent, or none for one
                that is.
        """
        values = self.family.stream_conditioning(stream_id)
        persistent = {n for n, spec in self.states.specs.items() if spec.persistent}
        if set(values) != persistent:
            raise ValueError(
                f"stream_conditioning({stream_id}) gave {sorted(values)}; the model declares "
                f"{sorted(persistent)} persistent: give exactly one value for each")
        for name, value in values.items():
            self.states.fill_slot(stream_id, name, value)

    def close_stream(self, stream_id: int) -> None:
        """Return the stream's blocks, state rows, decoder state and slot to their pools."""
        slot = self.states.slot_of(stream_id)
        self._release(stream_id)
        self.slots.free(slot)

    def _release(self, stream_id: int) -> None:
        """Free the stream in every manager that holds it (its slot stays allocated)."""
        if self.transducer is not None:
            if stream_id in self.transducer:
                self.transducer.free_stream(stream_id)
        elif stream_id in self.ctc:
            self.ctc.free_stream(stream_id)
        if stream_id in self.states:
            self.states.free_stream(stream_id)
        if self.attention is not None and stream_id in self.attention:
            self.attention.free_stream(stream_id)

    @property
    def hotword_tokenizer(self) -> object | None:
        """The units hotword graphs are spelled in: the CTC search's tokenizer when it is a
        beam search; None when the first pass takes no hotwords (greedy, a transducer)."""
        if self.transducer is not None or self.ctc.decoder.config.is_greedy:
            return None
        return self.ctc.decoder.tokenizer

    def set_hotwords(self, stream_id: int, graph: ContextGraph | None) -> None:
        """Bias the stream's CTC search towards ``graph``'s terms from its next chunk on
        (None: none). A transducer family's search takes no graph: nothing changes there."""
        if self.transducer is None:
            self.ctc.decoder.set_context(self.ctc.get_state(stream_id), graph)

    def reset_stream(self, stream_id: int) -> None:
        """A segment's end: start the stream's history over in place, keeping its slot
        (K/V blocks freed, fixed-extent state zeroed, decoder state reset)."""
        if self.attention is not None:
            self.attention.reset_stream(stream_id)
        self.states.reset_stream(stream_id)
        if self.transducer is not None:
            self.transducer.reset_stream(stream_id)
        else:
            self.ctc.reset_stream(stream_id)

    def at_capacity(self, stream_id: int) -> bool:
        """A paged stream that filled its block table; a slot-runtime stream never is."""
        return self.attention is not None and self.attention.at_capacity(stream_id)

    # -- decoding ------------------------------------------------------------------------------
    def endpointer_with_silence(self, silence_s: float) -> Endpointer:
        """The engine's endpoint rules with rule 2 (silence after speech) at ``silence_s``
        (the defaults when the engine's endpointing is off)."""
        base = self.endpointer.config if self.endpointer is not None else dataclasses.replace(
            EndpointConfig(), frame_shift_s=self.family.timing.frame_shift_s)
        rule2 = EndpointRule(must_contain_speech=True, min_trailing_silence_s=silence_s)
        return Endpointer(dataclasses.replace(base, rule2=rule2))

    def decode(self, stream_ids: list[int], output: StepOutput,
               endpointers: list[Endpointer | None] | None = None) -> list[ChunkResult]:
        """Decode the cohort's log-probs with one batched decoder call.

        Args:
            endpointers: per stream, its own endpoint rules; None entries (or None) use the
                engine's.
        Returns each stream's current best text and the endpoint rule that fired, if any.
        Raises whatever decoding raises, with every stream's decoder state as before the call
        (the step commits a chunk only once all of it succeeded).
        """
        own = endpointers if endpointers is not None else [None] * len(stream_ids)
        rules = [e if e is not None else self.endpointer for e in own]
        if self.transducer is not None:
            restore = self.transducer.checkpoint(stream_ids)
            results = self.transducer.decode(stream_ids, output.log_probs, output.lengths)
            try:
                return [ChunkResult(r.hypothesis.text, _decide(e, r.stats, r.hypothesis),
                                    r.hypothesis, r.stats)
                        for r, e in zip(results, rules, strict=True)]
            except BaseException:
                restore()
                raise
        decoder = self.ctc.decoder
        states = [self.ctc.get_state(s) for s in stream_ids]
        lengths = torch.tensor(output.lengths, dtype=torch.int64)  # host: no device sync
        if output.log_probs.is_cuda:  # the search uploads it when rows differ in length
            lengths = lengths.pin_memory()
        restore = decoder.checkpoint(states, output.log_probs.shape[1])
        try:
            decoder.decode_streams(output.log_probs.float(), states, lengths)  # one search
            steps = decoder.partials(states)  # one read-back
            return [ChunkResult(step.hypothesis.text, _decide(e, step.stats, step.hypothesis),
                                step.hypothesis, step.stats)
                    for step, e in zip(steps, rules, strict=True)]
        except BaseException:
            restore()
            raise

    def final_hypothesis(self, stream_id: int, num_frames: int | None = None) -> Hypothesis:
        """The best hypothesis of the stream's current segment; with ``num_frames``, only its
        tokens first emitted in the segment's first ``num_frames`` frames (a segment that
        ends in the past: the later tokens are decoded again in the next one)."""
        if self.transducer is not None:
            hyp = self.transducer.final_hypothesis(stream_id)
            tokenizer = self.family.tokenizer
        else:
            decoder = self.ctc.decoder
            hyp = decoder.finalize_stream(self.ctc.get_state(stream_id))[0]
            tokenizer = decoder.tokenizer
        if num_frames is None:
            return hyp
        keep = sum(1 for t in hyp.timestamps if t < num_frames)
        if keep == len(hyp.tokens):
            return hyp
        tokens = hyp.tokens[:keep]
        text = tokenizer.decode(tokens) if tokenizer is not None else ""
        return dataclasses.replace(hyp, tokens=tokens, text=text,
                                   timestamps=hyp.timestamps[:keep])


def check_encoder_conditioning(family: ModelFamily, states: SlotStateCache,
                               carries: bool) -> None:
    """Refuse a model with persistent states (values per request, written at admission)
    where they cannot be written: by a runtime that does not carry encoder conditioning, or
    for a model that gives no values (``stream_conditioning``).

    Raises:
        ValueError: naming the states and what to change.
    """
    persistent = sorted(n for n, spec in states.specs.items() if spec.persistent)
    if not persistent:
        return
    encoder = type(family.streaming_encoder).__name__
    if not carries:
        raise ValueError(
            f"{encoder} declares persistent states {persistent}, written per stream at "
            "admission from its stream_conditioning, and this runtime cannot write them "
            "(carries_encoder_conditioning is False): serve the model with a runtime that "
            "does (StreamResources), or declare the states persistent=False")
    if not family.conditions_streams:
        raise ValueError(
            f"{encoder} declares persistent states {persistent} but has no "
            f"stream_conditioning(stream_id) giving their values: add it to {encoder}, or "
            "declare the states persistent=False")


# A segment's ceiling where neither the model, the K/V history nor a length rule sets one
DEFAULT_MAX_SEGMENT_S = 60.0


def segment_frame_limit(config: EngineConfig, family: ModelFamily,
                        cache_config: CacheConfig) -> int | None:
    """The most encoder frames one segment of a stream decodes before the engine ends it
    (reason ``max_length``), or None where the stream's K/V ceiling ends the stream first.

    The smallest of the model's position limit and the endpointer's length rules (rule 3: no
    silence or speech condition) plus two chunks (a rule is decided after a chunk, so a
    segment it ends is at most one chunk longer). Without either: None for a stream with
    unlimited history (it finishes ``length`` at ``max_stream_frames``), else
    `DEFAULT_MAX_SEGMENT_S`.
    """
    chunk = cache_config.chunk_size
    shift = family.timing.frame_shift_s
    limits = []
    if family.max_positions is not None:
        limits.append(family.max_positions)
    for _, rule in config.endpoint.rules() if config.endpoint is not None else ():
        if rule.min_trailing_silence_s == 0 and not rule.must_contain_speech:  # a length rule
            limits.append(math.ceil(rule.min_utterance_length_s / shift) + 2 * chunk)
    if limits:
        return max(min(limits), chunk)
    if family.paged_kv and not cache_config.has_eviction:
        return None
    return math.ceil(DEFAULT_MAX_SEGMENT_S / shift)


def decoded_frame_limit(segment_limit: int | None, family: ModelFamily,
                        cache_config: CacheConfig) -> int:
    """The most frames a stream's decoder state holds between resets (what its token buffers
    are allocated for): the segment limit, or the K/V ceiling of a stream with unlimited
    history, whichever comes first."""
    limits = [] if segment_limit is None else [segment_limit]
    if family.paged_kv and not cache_config.has_eviction:
        limits.append(cache_config.max_stream_frames)
    return min(limits)


def _decide(endpointer: Endpointer | None, stats: FrameStats,
            hypothesis: Hypothesis) -> EndpointDecision | None:
    """The endpoint decision for one stream's chunk (None without endpointing)."""
    if endpointer is None:
        return None
    return endpointer.decide(stats, hypothesis.tokens, hypothesis.timestamps)


def _step_padding(family: ModelFamily, cache_config: CacheConfig) -> StepPadding:
    """How the family's padded steps round their shapes (`oasr.engine.runner.padding`)."""
    chunk = cache_config.chunk_size
    return StepPadding(
        ladder=WidthLadder(cache_config.max_batch_size),
        window_frames=family.chunk_geometry(chunk).window_frames,
        chunk_size=chunk,
        block_size=cache_config.block_size_frames,
        max_blocks_per_seq=cache_config.max_blocks_per_seq,
        offset_sized_positions=family.offset_sized_positions,
        max_positions=family.max_positions,
    )


def _transducer_streams(family: ModelFamily, config: EngineConfig) -> TransducerStreams | None:
    """The transducer search states of a transducer family (beam = the decoder's beam_size)."""
    if family.decoding != "transducer":
        return None
    return TransducerStreams(family.model, family.tokenizer,  # type: ignore[arg-type]
                             beam=config.decoder.beam_size)


def _icefall_decode_setting(config: EngineConfig) -> tuple[int, int]:
    """An icefall Zipformer's decode-time (chunk, left context) in 50 Hz frames from the
    engine's chunk (40 ms encoder frames) and left chunks: ``--chunk-size 8`` (the default)
    is icefall's ``--chunk-size 16``; left context ``--num-left-chunks`` chunks (default 4, as
    icefall's 16/64 and 32/128 pairs). Other families ignore it."""
    chunk = 2 * (config.chunk_size or 8)
    return chunk, chunk * (config.num_left_chunks if config.num_left_chunks > 0 else 4)


def decoder_lm(config: EngineConfig, tokenizer: object,
               device: torch.device) -> DecoderLm | None:
    """The LMs the config selects (see `EngineConfig.lm`): the directory's char LM and, when
    it has one, its word LM, checked against the model's units; None for none."""
    model_dir = DEFAULT_MODEL_DIR if config.model is None else Path(config.model)
    directory = config.resolve_lm_dir(model_dir)
    if directory is None:
        return None
    lm = load_decoder_lm(directory, device)
    units = getattr(tokenizer, "units", None)
    if units is not None:
        lm.check_units(units)
    return lm


def _separator_ids(tokenizer: object) -> list[int]:
    """The tokenizer's word-boundary unit (char models), which separates words and is not
    speech; none for a BPE model (its pieces carry the boundary)."""
    if not isinstance(tokenizer, CharTokenizer):
        return []
    units = tokenizer.units
    return [units.index(u) for u in (WORD_BOUNDARY, "<space>") if u in units]


@dataclass(frozen=True)
class ChunkResult:
    """What decoding one chunk of one stream produced."""

    text: str
    endpoint: EndpointDecision | None
    hypothesis: Hypothesis | None = None  # the best hypothesis (tokens and their frames)
    stats: FrameStats | None = None  # its endpointing inputs
