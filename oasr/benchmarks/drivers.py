"""The two ways of serving N streams that the benchmarks compare, driven chunk by chunk.

- `EngineDriver`: oasr's engine. N streams in one `ASREngine`; every step feeds each stream
  one chunk of audio and runs `ASREngine.step` (features, ONE batched paged encoder call, one
  batched CTC decode).
- `DenseLoop`: one stream at a time with dense caches, the way WeNet's runtime serves streams:
  per stream and chunk, the family's dense chunk call (`oasr.benchmarks.dense`) concatenates
  the K/V cache with the new frames, then the CTC head and a batch-1 decoder call. Same model,
  same features, same decoder (the bench's beam and LMs, `BenchModel.with_decoding`).

Both consume exactly one chunk of audio per stream per step, so their audio-seconds-per-
wall-second figures are comparable.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from oasr.audio import ChunkWindower, FeatureSource, FeatureWindow
from oasr.benchmarks.dense import dense_model_for
from oasr.benchmarks.workload import BenchModel
from oasr.decoding import DecoderState, GpuStreamingDecoder
from oasr.engine import EngineConfig
from oasr.engine.commands import AppendAudio, OpenStream
from oasr.engine.engine import ASREngine
from oasr.engine.events import Error, StreamEvent
from oasr.engine.families import family_for
from oasr.engine.runner.model_runner import BatchPlan
from oasr.engine.runner.streams import StreamResources, decoder_lm
from oasr.engine.runner.transducer import TransducerStreams


def sync(device: torch.device) -> None:
    """Wait for queued device work (CUDA), so wall time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_engine_config(num_streams: int, num_chunks: int, num_left_chunks: int = -1,
                        chunk_size: int | None = None, device: str = "auto",
                        dtype: str = "auto", cuda_graphs: str = "auto") -> EngineConfig:
    """An engine for ``num_streams`` streams of up to ``num_chunks`` chunks each.

    The pool is sized exactly (every stream's history plus one in-flight block), not derived
    from free memory; endpointing is off so both ways keep the same history; no timeouts;
    ``chunk_size`` None = the model's trained chunk; ``cuda_graphs`` as `EngineConfig`'s.
    """
    per_stream = num_left_chunks + 2 if num_left_chunks >= 0 else num_chunks + 2
    return EngineConfig(
        device=device, dtype=dtype, max_batch_size=num_streams, chunk_size=chunk_size,
        num_left_chunks=num_left_chunks, max_num_blocks=num_streams * per_stream,
        max_blocks_per_seq=max(per_stream, 8), endpoint=None, max_wait_time_s=math.inf,
        idle_timeout_s=math.inf, max_session_s=math.inf, max_pending_audio_s=math.inf,
        cuda_graphs=cuda_graphs,
    )


@dataclass
class StreamFeed:
    """Hands each stream its audio one chunk at a time (the first slice fills one window).

    Attributes:
        speech: per stream (N,) float32 samples.
        first_samples: samples of a stream's first slice (what its first chunk needs).
        step_samples: samples of every later slice (one chunk of audio).
    """

    speech: list[np.ndarray]
    first_samples: int
    step_samples: int
    position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.position = [0] * len(self.speech)

    @staticmethod
    def for_model(bench: BenchModel, speech: list[np.ndarray]) -> StreamFeed:
        return StreamFeed(speech, bench.samples_for_frames(bench.chunk_size), bench.chunk_samples)

    def next_slice(self, stream: int) -> np.ndarray:
        """The stream's next chunk of samples (empty once its audio is used up)."""
        start = self.position[stream]
        step = self.first_samples if start == 0 else self.step_samples
        self.position[stream] = start + step
        return self.speech[stream][start : start + step]


class EngineDriver:
    """N streams in one ASREngine, fed one chunk of audio per stream per step."""

    def __init__(self, bench: BenchModel, speech: list[np.ndarray], config: EngineConfig) -> None:
        config = bench.with_decoding(config)  # the bench's beam and LMs
        self.config = config
        self.resources = StreamResources.build(config, bench.model)
        self.engine = ASREngine(config, self.resources)
        self.feed = StreamFeed.for_model(bench, speech)
        self.events: list[StreamEvent] = []
        for stream in range(len(speech)):
            self.engine.submit(OpenStream(stream, self._sink))

    def _sink(self, event: StreamEvent) -> None:
        if isinstance(event, Error):
            self.events.append(event)

    def step(self) -> float:
        """Feed every stream one chunk and run one engine step. Returns audio seconds decoded."""
        for stream in range(len(self.feed.speech)):
            samples = self.feed.next_slice(stream)
            if samples.size:
                self.engine.submit(AppendAudio(stream, samples))
        before = self.engine.stats.total_audio_s
        self.engine.step()
        if self.events:
            raise RuntimeError(f"engine reported an error: {self.events[0].to_json()}")
        return self.engine.stats.total_audio_s - before

    def run(self, num_steps: int) -> tuple[float, float]:
        """Run ``num_steps`` steps. Returns (wall seconds, audio seconds decoded)."""
        device = self.resources.runner.device
        sync(device)
        start = time.perf_counter()
        audio = sum(self.step() for _ in range(num_steps))
        sync(device)
        return time.perf_counter() - start, audio


@dataclass
class _DenseStream:
    """One stream's state in the dense loop: features, windows, dense caches, decoder."""

    features: FeatureSource
    windower: ChunkWindower
    decoder_state: DecoderState
    cache: Any
    offset: int = 0
    text: str = ""


class DenseLoop:
    """Streams served one at a time with dense caches concatenated every chunk, the model's
    family's baseline (`oasr.benchmarks.dense`); same features and decoder as the engine."""

    def __init__(self, bench: BenchModel, speech: list[np.ndarray], num_left_chunks: int = -1,
                 device: torch.device | None = None, dtype: torch.dtype | None = None,
                 int8: bool = False) -> None:
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # None: what the engine's dtype "auto" picks for this model on this device
        self.dtype = dtype or EngineConfig().resolve_dtype(self.device, bench.family_name)
        model = bench.model
        if int8 or next(model.parameters()).dtype != self.dtype:
            model = copy.deepcopy(model)  # never cast (and round) the shared model in place
        self.model = model.to(self.device, self.dtype).eval()
        if int8:  # quantized the way the engine quantizes its copy
            family_for(self.model).quantize_int8()
        self.frame_seconds = bench.frame_seconds
        self.dense = dense_model_for(self.model, bench.family_name, bench.chunk_size,
                                     num_left_chunks)
        self.feed = StreamFeed.for_model(bench, speech)
        family = bench.family
        decoding = bench.with_decoding(EngineConfig())  # the engine's beam and LMs
        self.decoder = GpuStreamingDecoder(
            decoding.decoder, family.tokenizer, device=self.device,
            lm=decoder_lm(decoding, family.tokenizer, self.device))
        self.transducer = None  # a transducer family searches as the engine does
        if family.decoding == "transducer":
            self.transducer = TransducerStreams(self.model, family.tokenizer,  # type: ignore[arg-type]
                                                beam=decoding.decoder.beam_size)
            for index in range(len(speech)):
                self.transducer.allocate_stream(index)
        self.streams = [
            _DenseStream(family.new_features(), ChunkWindower(bench.chunk_geometry),
                         self.decoder.create_state(1, family.vocab_size), self.dense.empty_cache())
            for _ in speech
        ]

    @torch.inference_mode()
    def step_stream(self, index: int) -> float:
        """One chunk of one stream. Returns audio seconds decoded (0 when it had no window)."""
        stream = self.streams[index]
        samples = self.feed.next_slice(index)
        if samples.size:
            stream.features.accept_waveform(samples)
        window = stream.windower.pop_window(stream.features)
        if window is None:
            return 0.0
        xs = torch.from_numpy(window.feats).to(self.device, self.dtype).unsqueeze(0)  # (1, T, F)
        log_probs, stream.cache = self.dense.forward(xs, stream.offset, stream.cache)
        if self.transducer is not None:  # (1, T', joiner_dim) projected frames
            (result,) = self.transducer.decode([index], log_probs, [log_probs.size(1)])
            stream.text = result.hypothesis.text
        else:
            self.decoder.decode_chunk(log_probs.float(), stream.decoder_state)  # (1, T', V)
            stream.text = self.decoder.partial(stream.decoder_state).text
        stream.offset += log_probs.size(1)
        return log_probs.size(1) * self.frame_seconds

    def step(self) -> float:
        """One chunk of every stream, one stream after the other."""
        return sum(self.step_stream(i) for i in range(len(self.streams)))

    def run(self, num_steps: int) -> tuple[float, float]:
        """Run ``num_steps`` steps. Returns (wall seconds, audio seconds decoded)."""
        sync(self.device)
        start = time.perf_counter()
        audio = sum(self.step() for _ in range(num_steps))
        sync(self.device)
        return time.perf_counter() - start, audio


def snapshot_states(resources: StreamResources) -> dict[str, torch.Tensor]:
    """A copy of every fixed-extent state buffer (conv caches / conv-stem tails)."""
    return {name: buf.clone() for name, buf in resources.states.buffers.items()}


def restore_states(resources: StreamResources, saved: dict[str, torch.Tensor]) -> None:
    """Put `snapshot_states`' copy back in place (same storage)."""
    for name, buf in resources.states.buffers.items():
        buf.copy_(saved[name])


class RunnerDriver:
    """The engine's model call alone (`ModelRunner` prepare / forward / commit) on fixed
    feature windows: for per-chunk cost and FLOP counts, without features or decoding."""

    def __init__(self, bench: BenchModel, feats: list[np.ndarray], config: EngineConfig) -> None:
        self.resources = StreamResources.build(config, bench.model)
        self.runner = self.resources.runner
        self.chunk_size = self.resources.chunk_size
        self.stride = bench.family.chunk_geometry(self.chunk_size).stride_frames
        self.windows = [bench.windows(f) for f in feats]  # per stream: (window, F) each
        self.stream_ids = list(range(len(feats)))
        self.slots = [self.resources.open_stream(s) for s in self.stream_ids]
        self.num_chunks_done = 0

    def plan(self) -> BatchPlan:
        """The cohort's next chunk (every stream at the same chunk index)."""
        k = self.num_chunks_done
        windows = [FeatureWindow(feats=np.ascontiguousarray(w[k]), index=k,
                                 start_frame=k * self.stride,
                                 num_output_frames=self.chunk_size, is_last=False)
                   for w in self.windows]
        offsets = [k * self.chunk_size] * len(self.stream_ids)
        return BatchPlan(self.stream_ids, self.slots, windows, offsets)

    def advance(self) -> float:
        """Run and commit the next chunk of every stream. Returns wall seconds of the forward."""
        plan = self.plan()
        self.runner.prepare(plan)
        seconds = self.time_forward(plan)
        self.runner.commit(plan)
        self.num_chunks_done += 1
        return seconds

    def time_forward(self, plan: BatchPlan, repeats: int = 1) -> float:
        """Best wall seconds of ``repeats`` forwards of ``plan`` (prepared, not committed).

        Each forward rewrites the same pool slots; the fixed-extent state is restored after
        each extra run so the stream continues exactly as if it ran once.
        """
        device = self.runner.device
        saved = snapshot_states(self.resources) if repeats > 1 else None
        best = math.inf
        for _ in range(repeats):
            if saved is not None:
                restore_states(self.resources, saved)
            sync(device)
            start = time.perf_counter()
            self.runner.forward(plan)
            sync(device)
            best = min(best, time.perf_counter() - start)
        return best
