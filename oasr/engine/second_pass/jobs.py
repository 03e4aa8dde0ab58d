"""What the engine and the second pass hand each other: jobs (a segment's final, an open
segment's refinement) and their answers. Plain picklable records: they cross a thread or a
process boundary (``oasr.engine.second_pass.worker``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SecondPassJob:
    """One segment to re-decode.

    Attributes:
        job_id: unique per engine.
        stream_id, segment: whose segment.
        audio: (N,) float32 16 kHz samples of the segment, N <= 30 s.
        submitted_at: monotonic time the engine queued it.
        ctc_text: the first pass's text of the same audio (the guard's witness).
        prefix: Whisper tokens the final must begin with (the refinement's committed words).
        context: the previous segment's final text, whose audio is the first
            ``context_samples`` of ``audio``: forced before ``prefix`` so that the decode
            continues it; the final's text is what follows it.
        context_job: the previous segment's job when its final was not out yet: the worker
            decodes this job once that one is answered, with its text as ``context``.
        context_tokens: ``context``'s Whisper tokens (the worker fills them in).
        draft: Whisper tokens after ``prefix`` that the newest refinement decoded (its
            tentative words): a greedy decode of a busy server's final takes them where each
            is its own choice (`RefineJob.draft`); the beam search does not use them.
        paced: its stream sends at real-time pace (a live speaker); False for one sending
            faster (a file streamed at full speed, an upload): a paced stream's finals are
            decoded first and find room in a full backlog, at a faster stream's expense.
        prompt: the stream's previous-text prompt for Whisper (its prompt and hotwords), ""
            for none.
        hotwords: the stream's hotwords: the guard does not reject Whisper's text for them.
    """

    job_id: int
    stream_id: int
    segment: int
    audio: np.ndarray
    submitted_at: float
    ctc_text: str = ""
    prefix: tuple[int, ...] = ()
    context: str = ""
    context_samples: int = 0
    context_job: int | None = None
    context_tokens: tuple[int, ...] = ()
    draft: tuple[int, ...] = ()
    paced: bool = True
    prompt: str = ""
    hotwords: tuple[str, ...] = ()


@dataclass(frozen=True)
class RefineJob:
    """An open segment's audio so far, to refine its partial (``oasr.engine.live.refine``).

    Attributes:
        job_id: unique per engine (shared with ``SecondPassJob`` ids).
        stream_id, segment: whose segment.
        audio: (N,) float32 16 kHz samples from the segment's start.
        prefix: Whisper tokens of the committed words, forced as the transcript's start.
        num_frames: segment-relative encoder frames the audio covers.
        at_pause: the stream paused after its last word (its segment may end here): decoded
            beside the finals, not in the background after them.
        context: the previous segment's final text, whose audio is the first
            ``context_samples`` of ``audio`` (as a final's, `SecondPassJob`): a segment's
            first words are then heard after the sentence before them, not cold.
        context_tokens: ``context``'s Whisper tokens (the worker fills them in).
        draft: the newest refinement's tokens after ``prefix`` (its tentative words): the
            greedy decode takes them where they are its own choice on the longer audio, in
            one decoder call, and decodes on from the first that is not.
        ctc_text: the CTC pass's text of the segment so far: the witness a decode redone
            without the context must agree with (`SecondPassLoop._heard_alone`).
        prompt, hotwords: as a final's (`SecondPassJob`).
    """

    job_id: int
    stream_id: int
    segment: int
    audio: np.ndarray
    prefix: tuple[int, ...]
    num_frames: int
    at_pause: bool = False
    context: str = ""
    context_samples: int = 0
    context_tokens: tuple[int, ...] = ()
    draft: tuple[int, ...] = ()
    ctc_text: str = ""
    prompt: str = ""
    hotwords: tuple[str, ...] = ()


@dataclass(frozen=True)
class RefineDone:
    """A finished refinement (a command back to the engine): Whisper's text of the audio so
    far, its tokens and where each word ends in them; ``failed`` when it failed its
    safeguards (no fallback is tried for a refinement); ``word_probs``: per word, the
    probability of its least likely generated token (1.0 for forced words; empty when the
    decoder did not say); ``alone``: decoded again without the context, after which Whisper
    heard nothing (`SecondPassLoop._heard_alone`): its words are shown, not committed (the
    final, decoded with the context, need not begin with them)."""

    job_id: int
    stream_id: int
    segment: int
    text: str
    tokens: tuple[int, ...]
    word_ends: tuple[int, ...]
    failed: bool
    num_frames: int
    word_probs: tuple[float, ...] = ()
    alone: bool = False


@dataclass(frozen=True)
class SecondPassDone:
    """A finished job (a command back to the engine).

    ``text`` is the final's text from the second pass: Whisper's (``source`` "whisper"; "" when
    Whisper judged the segment to hold no speech) or a digit string combined from Whisper's
    and the CTC text (``source`` "combined"); None when the final keeps its CTC text: Whisper
    raised, or the guard rejected its text (``rejected`` names the guard's reason).
    ``tokens`` are Whisper's tokens of ``text`` and ``word_ends`` where each word ends in
    them, when the text is Whisper's own (else empty): an early decode's answer then refines
    the open segment's partial until the segment ends. ``word_probs``: per word of ``text``,
    the probability of its least likely generated token (1.0 for forced words), when the
    text is Whisper's own and the decoder gave its tokens' probabilities (else empty).
    """

    job_id: int
    stream_id: int
    text: str | None
    seconds: float
    source: str = "whisper"
    rejected: str | None = None
    tokens: tuple[int, ...] = ()
    word_ends: tuple[int, ...] = ()
    word_probs: tuple[float, ...] = ()


Answer = SecondPassDone | RefineDone


def failed_answer(job: SecondPassJob | RefineJob) -> Answer:
    """The answer for a job whose decoder was lost: a final keeps its CTC text, a refinement
    failed."""
    if isinstance(job, RefineJob):
        return RefineDone(job.job_id, job.stream_id, job.segment, "", (), (), True, job.num_frames)
    return SecondPassDone(job.job_id, job.stream_id, None, 0.0, "ctc")
