"""The second pass's first decodes by beam search (``WhisperDecodeConfig.beam_size`` > 1).

A batch of waiting requests with one prompt length is decoded to the end in one batched call,
on dense per-request K/V with the cross K/V shared by a request's beams (a beam grid would
alias the paged pool's pages, see `oasr.cache.decoder_kv.PagedDecoderKv.select`). Each best
beam is then judged as a sampled row is: cut at the request's token budget, checked for loops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from oasr.models.whisper.decode_requests import DecodeRequest
from oasr.models.whisper.decoding import beam_search
from oasr.models.whisper.dense_kv import DecoderKv
from oasr.models.whisper.loader import WhisperCheckpoint
from oasr.models.whisper.safeguards import DecodeAttempt
from oasr.models.whisper.transcriber import WhisperDecodeConfig
from oasr.models.whisper.window import EncodedSegments, SegmentEncoder


def beam_first_decodes(checkpoint: WhisperCheckpoint, encoder: SegmentEncoder,
                       config: WhisperDecodeConfig, requests: Sequence[DecodeRequest],
                       prompts: Sequence[tuple[int, ...]],
                       stop: Callable[[], bool] | None = None,
                       start: int = 0) -> list[DecodeAttempt]:
    """The temperature-0 decode of each request, by beam search in one batched call.

    Args:
        encoder: the encoder whose cross K/V the requests' encoder states are turned into.
        requests: encoded requests (``encoded`` set), all with ``prompts`` of one length.
        prompts: each request's decoder prompt (start tokens, then its forced prefix).
        stop: asked before each decoder call; True gives the decode up.
        start: where the start tokens begin in each prompt (after a previous-text prompt of
            that length).
    Returns:
        One attempt per request, in order (``looped`` / ``truncated`` as the row rules say).
    Raises:
        SearchStopped: ``stop`` said so.
    """
    model, spec = checkpoint.model, checkpoint.spec
    states = [r.encoded for r in requests]
    encoded = EncodedSegments(torch.cat([s.states for s in states if s is not None]),
                              tuple(s.num_encoded[0] for s in states if s is not None))
    limit = max(r.max_new_tokens for r in requests)
    kv = DecoderKv(encoder.cross_kv(encoded), len(prompts[0]) + limit, config.kv_cache,
                   shared_cross=True)
    prompt = torch.tensor([list(p) for p in prompts], device=model.device)  # (N, P)
    hyps = beam_search(model, spec, kv, config.beam_size, limit, prompt=prompt, stop=stop,
                       start=start)
    attempts = []
    repetition = config.repetition
    for request, hyp in zip(requests, hyps, strict=True):
        tokens = hyp.tokens[: request.max_new_tokens]
        truncated = len(hyp.tokens) >= request.max_new_tokens
        looped = repetition is not None and any(
            repetition.is_looping(tokens[:n]) for n in range(1, len(tokens) + 1))
        attempts.append(request.attempt(checkpoint.tokenizer, tokens, 0.0, hyp.log_prob,
                                        hyp.no_speech_prob, looped, truncated and not looped,
                                        hyp.token_log_probs))
    return attempts
