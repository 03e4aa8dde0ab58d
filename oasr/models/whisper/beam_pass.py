"""The second pass's first decodes by beam search (``WhisperDecodeConfig.beam_size`` > 1).

A batch of waiting requests is searched together by a `BeamSearch`, one token for all of them
per decoder call, on dense per-request K/V with the cross K/V shared by a request's beams (a beam
grid would alias the paged pool's pages, see `oasr.cache.decoder_kv.PagedDecoderKv.select`).
Each best beam is then judged as a sampled row is: cut at the request's token budget, checked
for loops.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from oasr.models.whisper.decode_requests import DecodeRequest
from oasr.models.whisper.decoding import BeamHypothesis, BeamSearch
from oasr.models.whisper.dense_kv import DecoderKv
from oasr.models.whisper.loader import WhisperCheckpoint
from oasr.models.whisper.safeguards import DecodeAttempt
from oasr.models.whisper.transcriber import WhisperDecodeConfig
from oasr.models.whisper.window import EncodedSegments, SegmentEncoder


def start_beam_search(search: BeamSearch, encoder: SegmentEncoder, config: WhisperDecodeConfig,
                      requests: Sequence[DecodeRequest], prompts: Sequence[tuple[int, ...]],
                      start: int = 0) -> None:
    """Start ``search`` (idle) on encoded requests, as groups keyed by their request ids.

    Args:
        encoder: the encoder whose cross K/V the requests' encoder states are turned into.
        requests: encoded requests (``encoded`` set), all with ``prompts`` of one length;
            each may generate its own ``max_new_tokens``.
        prompts: each request's decoder prompt (start tokens, then its forced prefix).
        start: where the start tokens begin in each prompt (after a previous-text prompt of
            that length).
    """
    states = [r.encoded for r in requests]
    encoded = EncodedSegments(torch.cat([s.states for s in states if s is not None]),
                              tuple(s.num_encoded[0] for s in states if s is not None))
    limits = [r.max_new_tokens for r in requests]
    own, tail = encoder.split_cross_kv(encoded)
    kv = DecoderKv(own, len(prompts[0]) + max(limits), config.kv_cache, shared_cross=True,
                   shared_tail=tail)
    prompt = torch.tensor([list(p) for p in prompts], device=search.model.device)  # (N, P)
    search.start(kv, [r.request_id for r in requests], limits, prompt, start)


def beam_attempt(checkpoint: WhisperCheckpoint, config: WhisperDecodeConfig,
                 request: DecodeRequest, hyp: BeamHypothesis) -> DecodeAttempt:
    """The request's temperature-0 attempt from its best beam (``looped`` / ``truncated`` as
    the row rules say)."""
    tokens = hyp.tokens[: request.max_new_tokens]
    truncated = len(hyp.tokens) >= request.max_new_tokens
    repetition = config.repetition
    looped = repetition is not None and any(
        repetition.is_looping(tokens[:n]) for n in range(1, len(tokens) + 1))
    return request.attempt(checkpoint.tokenizer, tokens, 0.0, hyp.log_prob, hyp.no_speech_prob,
                           looped, truncated and not looped, hyp.token_log_probs)
