"""Whisper as a batch transcriber: waveforms in, transcripts out, the decoder K/V dense or on
the paged decoder pool (``DecoderKVCacheManager``) as the config says."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from oasr.cache import BlockPool, CacheConfig
from oasr.cache.decoder_kv import DecoderKVCacheManager, resolve_kv_storage
from oasr.fmha.fp8 import FP8_DTYPE, check_kv_cache_format
from oasr.models.fused_linear import fusable
from oasr.models.whisper.decoding import (
    GreedyHypothesis,
    WhisperTranscript,
    beam_search,
    default_max_new_tokens,
    greedy_search,
)
from oasr.models.whisper.dense_kv import DecoderKv
from oasr.models.whisper.loader import WhisperCheckpoint, load_whisper
from oasr.models.whisper.logits import LOGITS_BACKENDS
from oasr.models.whisper.model import prepack
from oasr.models.whisper.quantization import check_kv_cache_servable, decoder_kv_bytes_per_token
from oasr.models.whisper.safeguards import FallbackRule, RepetitionStop, TokenBudget
from oasr.models.whisper.window import EncodedSegments, EncoderWindow, SegmentEncoder

DECODE_DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class WhisperDecodeConfig:
    """How the second pass decodes.

    Attributes:
        kv_storage: ``auto`` (paged for greedy), ``paged`` or ``dense``.
        kv_cache: None (served dtype) or ``"fp8_e4m3"``.
        beam_size: 1 is greedy; more runs beam search on dense per-group buffers.
        max_new_tokens: generated-token cap per row; None = every position the model has.
        max_rows: rows decoded together, and rows of the paged pool (16: a fallback ladder of
            five temperatures x three samples fits at once).
        block_size: tokens (frames) per page of the paged pool.
        max_num_blocks: pages of the paged pool; None = from ``kv_budget_gib``, else
            ``max_rows`` rows at full ceiling.
        kv_budget_gib: the paged pool as a byte budget: as many pages as fit at the format's
            bytes per token (``decoder_kv_bytes_per_token``: fp8 affords ~1.9-3.8x the pages of
            float16 / float32). Rows admitted are still capped by ``max_rows``; ``can_admit``
            decides how many of them the pages hold.
        encoder_window: how much audio the encoder runs on (default: the segment plus 2 s,
            in 0.5 s buckets, the rest of the 30 s window filled with silence's states).
        refine_window: the same for the continuous decoder's background requests (refined
            partials).
        fallback: when the continuous decoder redoes a decode at a higher temperature
            (``FallbackRule(temperatures=(0.0,))``: never; a failed decode is still flagged).
        token_budget: per-segment token cap from its duration (continuous decoder); None:
            ``max_new_tokens`` for every segment.
        repetition: stop a row that loops (continuous decoder); None: never.
        logits: how the output projection multiplies (`LogitsProjection`'s backends): "int8"
            (on CPU: int8 weights, a quarter of the bytes per step), "auto" (float32, the
            faster BLAS), "torch" or "blas".
        dtype: the served model's dtype (`load_for_decoding`): "auto" (bfloat16 on a CPU that
            multiplies it natively, where the linears run fused on its matrix units; float32
            elsewhere), "float32" or "bfloat16".
    """

    kv_storage: str = "auto"
    kv_cache: str | None = None
    beam_size: int = 1
    max_new_tokens: int | None = None
    max_rows: int = 16
    block_size: int = 16
    max_num_blocks: int | None = None
    kv_budget_gib: float | None = None
    encoder_window: EncoderWindow = EncoderWindow()
    refine_window: EncoderWindow = EncoderWindow()
    fallback: FallbackRule = FallbackRule()
    token_budget: TokenBudget | None = TokenBudget()
    repetition: RepetitionStop | None = RepetitionStop()
    logits: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.encoder_window, EncoderWindow):
            raise ValueError(f"WhisperDecodeConfig.encoder_window must be an EncoderWindow, "
                             f"got {type(self.encoder_window).__name__}")
        check_kv_cache_format(self.kv_cache)
        if self.dtype not in DECODE_DTYPES:
            raise ValueError(f"WhisperDecodeConfig.dtype must be one of {DECODE_DTYPES}, "
                             f"got {self.dtype!r}")
        if self.logits not in LOGITS_BACKENDS:
            raise ValueError(f"WhisperDecodeConfig.logits must be one of {LOGITS_BACKENDS}, "
                             f"got {self.logits!r}")
        resolve_kv_storage(self.kv_storage, self.beam_size)
        for name in ("max_rows", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"WhisperDecodeConfig.{name} must be >= 1, got {getattr(self, name)}")

        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 or None, got {self.max_new_tokens}")
        if self.kv_budget_gib is not None:
            if not math.isfinite(self.kv_budget_gib) or self.kv_budget_gib <= 0:
                raise ValueError(f"kv_budget_gib must be a positive number of GiB, got "
                                 f"{self.kv_budget_gib}")
            if self.max_num_blocks is not None:
                raise ValueError(f"give max_num_blocks ({self.max_num_blocks}) or kv_budget_gib "
                                 f"({self.kv_budget_gib}), not both")
        if self.max_num_blocks is not None and self.max_num_blocks < self.max_rows:
            raise ValueError(
                f"max_num_blocks ({self.max_num_blocks}) < max_rows ({self.max_rows}): "
                "raise max_num_blocks or leave it None"
            )


def decode_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype a ``WhisperDecodeConfig.dtype`` name serves in on ``device``: "auto" is
    bfloat16 on a CPU whose oneDNN multiplies it natively (AVX512-BF16 or AMX: the fused
    linears, `oasr.models.fused_linear`), float32 elsewhere (a CPU that would emulate bfloat16,
    a GPU: Whisper there is served as before)."""
    if name == "auto":
        native = device.type == "cpu" and fusable(torch.zeros(1, dtype=torch.bfloat16))
        return torch.bfloat16 if native else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_for_decoding(config: WhisperDecodeConfig | None = None,
                      device: torch.device | str | None = None) -> WhisperCheckpoint:
    """Whisper tiny.en (the installed checkpoint) in ``config.dtype`` on ``device`` (default:
    CUDA when available, else CPU), its fused linears' weights packed now rather than in the
    first decode (`oasr.models.whisper.model.prepack`; the output projection's when its
    decoder is built, `LogitsProjection.serve`). With int8 logits, or outside float32 (where
    no BLAS product reads it as (d, V)), the embedding stays stored (V, d): the logits'
    float32 rescoring gathers its rows (30 rows' 64 candidates: 1 ms, against 11 ms as
    columns of (d, V) on a Sapphire Rapids core).

    Raises:
        FileNotFoundError: no Whisper checkpoint is installed.
    """
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = decode_dtype((config or WhisperDecodeConfig()).dtype, target)
    checkpoint = load_whisper(device=target, dtype=dtype)
    if dtype != torch.float32 or (config or WhisperDecodeConfig()).logits == "int8":
        embedding = checkpoint.model.decoder.embedding.weight
        embedding.data = embedding.data.contiguous()
    prepack(checkpoint.model)
    return checkpoint


def without_safeguards(config: WhisperDecodeConfig | None = None) -> WhisperDecodeConfig:
    """``config`` decoding plain greedy: one temperature, no token budget, no repetition stop
    (what the second pass did before its safeguards; for comparisons and exactness tests)."""
    return replace(config or WhisperDecodeConfig(), fallback=FallbackRule(temperatures=(0.0,)),
                   token_budget=None, repetition=None)


def decoder_pool_blocks(checkpoint: WhisperCheckpoint, config: WhisperDecodeConfig) -> int:
    """Pages of the second pass's decoder pool: ``max_num_blocks``; else what ``kv_budget_gib``
    holds at the format's bytes per token; else ``max_rows`` rows at full ceiling.

    Raises:
        ValueError: a budget that cannot hold one row at its ceiling (nothing could ever be
            admitted), with the budget that would.
    """
    model, spec = checkpoint.model, checkpoint.spec
    ceiling = len(spec.prompt) + (config.max_new_tokens or default_max_new_tokens(model, spec))
    row_blocks = (math.ceil(ceiling / config.block_size)
                  + math.ceil(model.config.n_audio_ctx / config.block_size))
    if config.max_num_blocks is not None:
        return config.max_num_blocks
    if config.kv_budget_gib is None:
        return config.max_rows * row_blocks
    mc = model.config
    page_bytes = config.block_size * decoder_kv_bytes_per_token(
        mc.n_text_layer, mc.n_text_head, mc.text_head_dim, model.dtype, config.kv_cache)
    blocks = int(config.kv_budget_gib * 2**30) // page_bytes
    if blocks < row_blocks:
        need = row_blocks * page_bytes / 2**30
        raise ValueError(
            f"decoder K/V budget {config.kv_budget_gib} GiB holds {blocks} pages of "
            f"{page_bytes} bytes ({config.kv_cache or model.dtype}), but one row at its ceiling "
            f"({ceiling} tokens + {mc.n_audio_ctx} encoder frames) needs {row_blocks}: raise "
            f"the budget to at least {need:.4f} GiB")
    return blocks


def samples_per_temperature(config: WhisperDecodeConfig) -> int:
    """Sampled rows per temperature of the continuous decoder's fallback ladder (decoded all
    at once): ``best_of`` as far as ``max_rows`` allows, at least 1; 0 without a ladder."""
    ladder = len(config.fallback.temperatures) - 1
    if ladder < 1:
        return 0
    return max(1, min(config.fallback.best_of, config.max_rows // ladder))


def rows_per_request(config: WhisperDecodeConfig) -> int:
    """The most decoder rows one request of the continuous decoder holds at once: its
    fallback ladder's rows (every remaining temperature x ``samples_per_temperature``), else 1."""
    ladder = len(config.fallback.temperatures) - 1
    return max(1, ladder * samples_per_temperature(config))


def check_pool_admits_a_request(manager: DecoderKVCacheManager, config: WhisperDecodeConfig,
                                ceiling: int) -> None:
    """Refuse a continuous-decoder pool whose pages could never admit a request's largest
    group of rows (``rows_per_request`` rows at their ``ceiling``): that request would wait
    forever, and every segment queued behind it.

    Raises:
        ValueError: with the pages asked and held, and what to change.
    """
    group = rows_per_request(config)
    decision = manager.can_admit([ceiling] * group)
    if not decision.ok:
        raise ValueError(
            f"the second-pass decoder pool cannot admit one request's {group} rows (its "
            f"fallback ladder) of {ceiling} tokens: {decision.reason}; raise its budget "
            "(decode_kv_budget_gib / max_num_blocks) or lower fallback.best_of")


def build_decoder_manager(
    checkpoint: WhisperCheckpoint, config: WhisperDecodeConfig
) -> DecoderKVCacheManager:
    """A decoder pool sized from the model and ``config`` (its ceiling per row: prompt plus
    ``max_new_tokens``; its pages: `decoder_pool_blocks`), on the model's device, fp8 when
    ``config.kv_cache`` says so.

    Raises:
        ValueError: a K/V format the model or device cannot serve (`check_kv_cache_servable`),
            or a budget too small for one row.
    """
    model, spec = checkpoint.model, checkpoint.spec
    check_kv_cache_servable(
        config.kv_cache, kv_cache_dtypes=model.kv_cache_dtypes, model_dtype=model.dtype,
        device=model.device, head_dim=model.config.text_head_dim,
    )
    ceiling = len(spec.prompt) + (config.max_new_tokens or default_max_new_tokens(model, spec))
    table_width = math.ceil(ceiling / config.block_size)
    cache_config = CacheConfig(
        num_layers=model.config.n_text_layer,
        n_kv_head=model.config.n_text_head,
        head_dim=model.config.text_head_dim,
        hidden_dim=model.config.n_text_state,
        kernel_size=1,
        chunk_size=config.block_size,
        block_size_frames=config.block_size,
        max_num_blocks=decoder_pool_blocks(checkpoint, config),
        max_blocks_per_seq=table_width,
        max_batch_size=config.max_rows,
        device=model.device,
        dtype=FP8_DTYPE if config.kv_cache else model.dtype,
    )
    return DecoderKVCacheManager(BlockPool(cache_config), model.config.n_audio_ctx, config.kv_cache)


class WhisperTranscriber:
    """Transcribes batches of <= 30 s waveforms with one checkpoint.

    With paged storage every batch admits its rows into the decoder pool (``can_admit`` first,
    refusing with the reason), decodes, and frees the rows even when decoding fails, so the
    pool is back to full between calls.
    """

    def __init__(self, checkpoint: WhisperCheckpoint, config: WhisperDecodeConfig | None = None) -> None:
        self.checkpoint = checkpoint
        self.config = config or WhisperDecodeConfig()
        self.storage = resolve_kv_storage(self.config.kv_storage, self.config.beam_size)
        model = checkpoint.model
        check_kv_cache_servable(
            self.config.kv_cache, kv_cache_dtypes=model.kv_cache_dtypes, model_dtype=model.dtype,
            device=model.device, head_dim=model.config.text_head_dim,
        )
        model.decoder.logits.serve(self.config.logits, self.config.beam_size)
        self.encoder = SegmentEncoder(model, self.config.encoder_window)
        self.frontend = self.encoder.frontend
        self.manager = (
            build_decoder_manager(checkpoint, self.config) if self.storage == "paged" else None
        )
        self._row_ids = itertools.count()

    @property
    def max_new_tokens(self) -> int:
        ck = self.checkpoint
        return self.config.max_new_tokens or default_max_new_tokens(ck.model, ck.spec)

    @torch.inference_mode()
    def transcribe(self, waveforms: Sequence[torch.Tensor | np.ndarray]) -> list[WhisperTranscript]:
        """Transcripts of B mono 16 kHz waveforms (each <= 30 s), in ``max_rows`` groups."""
        out: list[WhisperTranscript] = []
        rows = self.config.max_rows
        for start in range(0, len(waveforms), rows):
            group = waveforms[start : start + rows]
            encoded = self.encoder.encode(group)  # states (B, 1500, d)
            out += self.decode_encoded(encoded.states, encoded.num_encoded)
        return out

    @torch.inference_mode()
    def decode_encoded(self, encoded: torch.Tensor,
                       num_encoded: Sequence[int] | None = None) -> list[WhisperTranscript]:
        """Transcripts of encoder states.

        Args:
            encoded: (B, S, d) encoder states, B <= ``max_rows``.
            num_encoded: per row the leading frames computed from its audio, the rest being
                the silent window's (``SegmentEncoder.encode``); None: all of them. Only the
                cross K/V projection uses it (the silent frames' K/V are computed once).
        """
        model, spec = self.checkpoint.model, self.checkpoint.spec
        segments = None if num_encoded is None else EncodedSegments(encoded, tuple(num_encoded))
        batch = encoded.size(0)
        if self.manager is None:
            cross, tail = ((model.decoder.cross_kv(encoded), None) if segments is None
                           else self.encoder.split_cross_kv(segments))
            capacity = len(spec.prompt) + self.max_new_tokens
            beam = self.config.beam_size > 1
            kv = DecoderKv(cross, capacity, self.config.kv_cache, shared_cross=beam,
                           shared_tail=tail)
            if beam:
                beams = beam_search(model, spec, kv, self.config.beam_size, self.max_new_tokens)
                hyps = [GreedyHypothesis(h.tokens, h.log_prob, h.no_speech_prob) for h in beams]
            else:
                hyps = greedy_search(model, spec, kv, batch, self.max_new_tokens)
        else:
            hyps = self._decode_paged(model.decoder.cross_kv(encoded) if segments is None
                                      else self.encoder.cross_kv(segments), batch)
        decode = self.checkpoint.tokenizer.decode
        return [WhisperTranscript(h.tokens, decode(h.tokens), h.avg_log_prob, h.no_speech_prob)
                for h in hyps]

    def _decode_paged(self, cross: list[tuple[torch.Tensor, torch.Tensor]],
                      batch: int) -> list[GreedyHypothesis]:
        assert self.manager is not None
        model, spec = self.checkpoint.model, self.checkpoint.spec
        ceiling = len(spec.prompt) + self.max_new_tokens
        decision = self.manager.can_admit([ceiling] * batch)
        if not decision.ok:
            raise RuntimeError(f"whisper decoder pool refused {batch} rows: {decision.reason}")
        row_ids: list[int] = []
        try:
            for _ in range(batch):
                row_id = next(self._row_ids)
                self.manager.allocate_row(row_id, ceiling)
                row_ids.append(row_id)
            self.manager.build_cross_kv(row_ids, cross)
            view = self.manager.view(row_ids)
            return greedy_search(model, spec, view, batch, self.max_new_tokens)
        finally:
            for row_id in row_ids:
                self.manager.free_row(row_id)
