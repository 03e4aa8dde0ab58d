"""The continuous decoder's bookkeeping: a request across its decodes, its place in the
queues, its running rows, and the result it ends with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from oasr.models.whisper.safeguards import DecodeAttempt
from oasr.models.whisper.tokenizer import WhisperTokenizer
from oasr.models.whisper.window import EncodedSegments


@dataclass(frozen=True)
class SecondPassResult:
    """A finished request.

    Attributes:
        request_id: as submitted.
        tokens: text tokens: the forced prefix (if any), then the generated ones (no prompt,
            no end token).
        text: their text.
        avg_log_prob: log-probability per generated token (end token included).
        no_speech_prob: P(no-speech) at the start token (None if the vocabulary has none);
            with a low ``avg_log_prob`` it flags a segment with no speech.
        temperature: of the kept decode (0 = greedy).
        num_decodes: decodes tried (1 = no fallback).
        failed: every temperature failed the fallback rule; the text is the best of them and
            should not be trusted.
        looped: the kept decode was stopped by the repetition rule.
        token_log_probs: log-probability of each generated token (after the prefix, no end
            token), from every kind of decode (greedy, sampled, beam search).
    """

    request_id: int
    tokens: tuple[int, ...]
    text: str
    avg_log_prob: float
    no_speech_prob: float | None
    temperature: float = 0.0
    num_decodes: int = 1
    failed: bool = False
    looped: bool = False
    token_log_probs: tuple[float, ...] = ()


@dataclass
class DecodeRequest:
    """A request across its decodes: budget, encoder states (kept for fallback), attempts."""

    request_id: int
    max_new_tokens: int
    encoded: EncodedSegments | None = None  # (1, S, d) once encoded
    prefix: tuple[int, ...] = ()  # forced text tokens after the start prompt
    # text tokens of a previous-text prompt, before the start prompt (hotwords, a prompt)
    previous: tuple[int, ...] = ()
    # text tokens after the prefix that a greedy decode takes where each is its own choice
    # (`oasr.models.whisper.decoding.accepted_draft`): an earlier decode's guess
    draft: tuple[int, ...] = ()
    background: bool = False  # decoded when nothing urgent waits; never falls back
    fast: bool = False  # greedy on the segment's own window (a busy server's finals)
    # a fast final's waveform, kept until its greedy decode passes (else it is beam-searched)
    waveform: torch.Tensor | np.ndarray | None = None
    attempts: list[DecodeAttempt] = field(default_factory=list)
    temperature_index: int = 0  # 0: the first decode; 1: the fallback ladder
    samples: list[DecodeAttempt] = field(default_factory=list)  # this temperature's rows so far
    num_rows: int = 1  # rows decoding this temperature
    sample_seed: int = 0  # its sampled rows' seed: of its input, so reruns sample alike

    def attempt(self, tokenizer: WhisperTokenizer, generated: tuple[int, ...],
                temperature: float, log_prob: float, no_speech_prob: float | None,
                looped: bool, truncated: bool,
                token_log_probs: Sequence[float] = ()) -> DecodeAttempt:
        """A decode's record: this request's prefix and the generated tokens, their text; the
        average log-probability is the generated tokens' (end token counted), and
        ``token_log_probs`` each one's (the end token's left out)."""
        tokens = self.prefix + tuple(generated)
        return DecodeAttempt(tokens, tokenizer.decode(tokens), temperature,
                             log_prob / (len(generated) + 1), no_speech_prob, looped, truncated,
                             tuple(token_log_probs[: len(generated)]))


@dataclass
class PendingDecode:
    request: DecodeRequest
    waveform: torch.Tensor | np.ndarray | None = None


@dataclass
class RunningRow:
    request: DecodeRequest
    row_id: int
    temperature: float
    no_speech_prob: float | None = None
    log_prob: float = 0.0
    tokens: list[int] = field(default_factory=list)
    token_log_probs: list[float] = field(default_factory=list)  # each of ``tokens``'
    generator: torch.Generator | None = None  # its own draws (temperature > 0 only)
