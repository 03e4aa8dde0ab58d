"""Endpoints between chunks: the pause after a segment's last word, heard in the audio.

The endpoint rules count the CTC output's blank frames, so they are decided when a chunk is
decoded: every 640 ms. A stream whose last chunk ended in a pause then waits up to a chunk
more for the rule's silence to be decoded, though the audio that arrived meanwhile already
says it is silence. `QuietTail` counts the quiet frames of that audio (`FrameEnergy`, one
value per encoder frame, computed as the audio arrives): the frames after the decoded audio
no louder than the decoded pause itself (the median energy of its trailing blank frames) plus
``margin_db``, up to the first louder sound (a click of up to ``click_s`` with quiet after it
is no sound that ends it), and only when that pause is clearly quieter than the word before
it (``min_contrast_db``: a pause the CTC pass heard as blank over speech it missed is no
reference; the word is looked for ``late_s`` further back when the CTC pass wrote its last
letters into the pause; a pause measured on the audio after the chunk, not on blank frames,
must not rise: that is a next word's onset). A pause quieter than ``floor_db`` is measured as
that floor: after
digital silence (a file's zero padding, a noise gate's output) the faintest sound would
otherwise count as loud, and a TTS voice's -65 dB lead-in before its next sentence ended
the quiet run 0.2 s short of the endpoint's silence. The word's own sound dying away at the
start of that audio (falling, for at most ``decay_s``) is quiet too: a chunk that ended a
frame after the last token had its pause measured on the fade, and the next frame of the same
fade ended the quiet run there, so the early decode waited for the next chunk. The engine
adds the quiet frames to the trailing blank frames and asks the stream's endpoint rules again
(`SegmentCuts.in_quiet`): a silence rule that fires ends the segment at the decoded audio's
end (the quiet frames are the next segment's first), and the early final decode starts as
soon as the pause is long enough. A quiet frame that holds the soft start of a word only
moves that word into the next segment, where the rule's silence would have put it anyway.

A quiet run that speech ends (frames as loud as a word, for ``resume_s``: `QuietRun.went_on`)
tells the engine the speaker went on before the next chunk does: an early final decode started
on a pause shorter than a sentence's is dropped then (`FinalPublisher.start_early`), so the
second pass is free for another stream's sentence end (two live streams traced: one stream's
doomed decode of a comma pause held the decoder while the other's sentence had ended, and
that final came 1.09 s after the sentence instead of 0.63 s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oasr.audio import FrameEnergy


@dataclass(frozen=True)
class QuietRun:
    """The quiet frames after a stream's decoded audio (`QuietTail.quiet_run`).

    Attributes:
        frames: the quiet frames that follow the decoded audio, up to the first loud one.
        went_on: speech came after them: a new word, not a click or a breath.
    """

    frames: int
    went_on: bool = False


@dataclass(frozen=True)
class QuietTail:
    """Thresholds of the quiet-frame count.

    Attributes:
        margin_db: a frame louder than the pause's median energy by more than this is not
            quiet (room noise moves by a few dB; a word's onset by far more).
        min_contrast_db: the loudest frame of the last ``word_s`` before the pause must be
            this much louder than the pause's median energy.
        min_pause_s: the shortest trailing blank run that makes a pause to measure.
        skip_s: the start of the pause left out of its energy (the CTC spike of a word's
            last letter comes before the word's sound ends).
        word_s: the audio before the pause that stands for the last word.
        late_s: how much earlier than the pause the CTC pass heard the last word's sound may
            have ended: a streaming model writes a word's last letters up to a few hundred ms
            after its sound (JFK's "Americans": 0.36 s, over room tone at -40 dB), and the
            pause it decoded then starts that late; when the pause is measured on its blank
            frames, the last word's loudest frame is looked for over ``word_s`` plus this
            before it (a pause measured on audio after a chunk that ended at the word may be
            the word's own end, as loud as the next soft word: only ``word_s`` there).
        floor_db: the quietest level a pause is measured at (dB full scale): a frame after
            the pause is loud only above ``max(pause, floor_db) + margin_db``.
        decay_s: the longest run of falling frames above that level that may begin the
            audio after the pause's measure and still count as quiet: the last word's sound
            dying away (a voice's release, a room's reverberation, a TTS voice's fade into
            digital silence), not a new word, which rises.
        resume_s: how much audio after the quiet run must be as loud as speech (no more than
            ``min_contrast_db`` below the last word's loudest frame) for the speaker to have
            gone on: a click lasts a frame or two, a breath stays well below the words.
        click_s: a burst above the pause's level this short, with quiet audio after it, is a
            click in the pause (a lip, a chair, the room), not a word: the quiet run goes on
            through it (0: every loud frame ends the run).
    """

    margin_db: float = 6.0
    min_contrast_db: float = 12.0
    min_pause_s: float = 0.08
    skip_s: float = 0.04
    word_s: float = 0.16
    late_s: float = 0.4
    floor_db: float = -60.0
    decay_s: float = 0.1
    resume_s: float = 0.06
    click_s: float = 0.04

    def __post_init__(self) -> None:
        if self.margin_db < 0 or self.min_contrast_db < 0:
            raise ValueError(f"QuietTail margins must be >= 0 dB, got {self.margin_db} and "
                             f"{self.min_contrast_db}")
        if not (self.min_pause_s > 0 and self.skip_s >= 0 and self.word_s > 0
                and self.late_s >= 0 and self.decay_s >= 0 and self.resume_s > 0
                and self.click_s >= 0):
            raise ValueError(
                f"QuietTail durations out of range: min_pause_s {self.min_pause_s} (> 0), "
                f"skip_s {self.skip_s} (>= 0), word_s {self.word_s} (> 0), "
                f"late_s {self.late_s} (>= 0), decay_s {self.decay_s} (>= 0), "
                f"resume_s {self.resume_s} (> 0), click_s {self.click_s} (>= 0)")

    def skip_frames(self, frame_shift_s: float) -> int:
        """``skip_s`` in encoder frames."""
        return round(self.skip_s / frame_shift_s)

    def quiet_run(self, energy: FrameEnergy, decoded_end: int, trailing_blank: int,
                  frame_shift_s: float) -> QuietRun:
        """The quiet frames that arrived after absolute frame ``decoded_end`` (the decoded
        audio's end), whose last ``trailing_blank`` frames the CTC pass heard as blank (0 when
        the pause is too short or not quieter than the word before it), and whether speech
        followed them.

        The pause's level is its median energy over at least ``min_pause_s``, after the
        ``skip_s`` its word's sound may still fill. A chunk that ended as the pause began
        (fewer trailing blank frames than that) has it measured on the audio after it, once
        enough has arrived; its skipped frames then count as quiet, as the CTC pass's blank
        frames do. Such a measure that rises by more than ``margin_db`` is no pause: a next
        word's onset after a short dip (a soft phrase 6 dB above that onset would count as
        quiet)."""
        min_pause = _frames(self.min_pause_s, frame_shift_s)
        skip = self.skip_frames(frame_shift_s)
        pause_start = decoded_end - trailing_blank
        if trailing_blank >= min_pause:
            skip = min(skip, trailing_blank - min_pause)
        measured_end = max(decoded_end, pause_start + skip + min_pause)
        if measured_end > energy.num_frames:
            return QuietRun(0)  # the pause's level is not measurable yet
        pause = energy.span(pause_start + skip, measured_end)
        # the word may lie further back when the CTC pass heard the pause as blank (its late
        # letters); a pause measured on audio it has not decoded may be the word's own end
        late = self.late_s if trailing_blank >= min_pause else 0.0
        word = energy.span(pause_start - _frames(self.word_s + late, frame_shift_s), pause_start)
        if len(pause) < min_pause or len(word) == 0:
            return QuietRun(0)
        reference = float(np.median(pause))
        if float(word.max()) - reference < self.min_contrast_db:
            return QuietRun(0)
        if trailing_blank < min_pause and _rises(np.maximum(pause, self.floor_db), self.margin_db):
            return QuietRun(0)  # measured on the audio after the chunk: a next word's onset
        skipped = max(0, pause_start + skip - decoded_end)  # new frames the word may still fill
        start = decoded_end + skipped
        tail = energy.span(start, energy.num_frames)
        threshold = max(reference, self.floor_db) + self.margin_db
        before = energy.span(start - 1, start)
        decay = self._decay(tail, float(before[0]) if len(before) else np.inf, threshold,
                            round(self.decay_s / frame_shift_s))
        quiet = decay + self._through_clicks(tail[decay:] > threshold,
                                             round(self.click_s / frame_shift_s))
        if quiet == len(tail):
            return QuietRun(skipped + len(tail))
        speech = max(threshold, float(word.max()) - self.min_contrast_db)
        went_on = int(np.count_nonzero(tail[quiet:] >= speech)) >= _frames(self.resume_s,
                                                                            frame_shift_s)
        return QuietRun(skipped + quiet, went_on)

    @staticmethod
    def _through_clicks(loud: np.ndarray, click: int) -> int:
        """Where the first run of ``loud`` frames longer than ``click`` frames starts, or
        one that the audio so far ends (it may be a word's onset): the quiet frames up to it,
        clicks between them counted as quiet; ``len(loud)`` when none."""
        for first, end in _loud_runs(loud):
            if end - first > click or end == len(loud):
                return first
        return len(loud)

    @staticmethod
    def _decay(tail: np.ndarray, level: float, threshold: float, limit: int) -> int:
        """The frames that begin ``tail`` above ``threshold`` while the word's sound dies away:
        each no louder than the one before (``level``: the frame before the tail), down to a
        quiet frame within ``limit`` frames; 0 when the level rises first, or stays up (the
        word goes on), or the audio has not told yet."""
        n = 0
        while n < len(tail) and threshold < tail[n] <= level:
            level = float(tail[n])
            n += 1
        return n if n <= limit and n < len(tail) and tail[n] <= threshold else 0

    def pause_after_speech(self, energy: FrameEnergy, decoded_end: int,
                           frame_shift_s: float) -> int:
        """The quiet frames that end the audio received after absolute frame ``decoded_end``,
        when the speech before them is there too (a word the CTC pass has not decoded yet);
        0 otherwise. Their level is the median of the last ``min_pause_s``; the loudest frame
        of the ``word_s`` before them must be ``min_contrast_db`` louder. A burst of up to
        ``click_s`` inside them that stays ``min_contrast_db`` below the loudest frame of that
        audio is the pause's own (room tone whose 20 ms frames peak 6-10 dB over its median:
        counted as loud, such a peak restarted the pause, and the early decode after "... is
        to be ill-disposed." waited for the next chunk, 0.3 s); a short burst nearer the
        word's level is a word's (taken for the pause's noise, JFK's stressed "you" rising out
        of a dip after "for" started an early decode before "you" was said)."""
        min_pause = _frames(self.min_pause_s, frame_shift_s)
        tail = energy.span(decoded_end, energy.num_frames)
        if len(tail) <= min_pause:
            return 0
        reference = float(np.median(tail[-min_pause:]))
        # a burst of the pause's own stays well below the word's level
        faint = tail < float(tail.max()) - self.min_contrast_db
        speech_end = _speech_end(tail > max(reference, self.floor_db) + self.margin_db, faint,
                                 round(self.click_s / frame_shift_s))
        if not speech_end:
            return 0  # no speech after the decoded audio
        word = tail[max(0, speech_end - _frames(self.word_s, frame_shift_s)):speech_end]
        if float(word.max()) - reference < self.min_contrast_db:
            return 0
        return len(tail) - speech_end


def _speech_end(loud: np.ndarray, faint: np.ndarray, click: int) -> int:
    """Where the last sound of ``loud`` frames ends: its last run of loud frames that is
    longer than ``click`` frames, or not all ``faint``, or begins them (the decoded word's
    own end) or ends them (it may go on); 0 when none. A shorter faint burst with quiet
    after it is the pause's own noise (a room's hum peaks 6-10 dB above its median for a
    20 ms frame at a time), not a word; a short burst near the word's level is a word's
    (a stressed "you" rising out of a dip in a reverberant room)."""
    for first, end in reversed(_loud_runs(loud)):
        if (end - first > click or not faint[first:end].all() or first == 0
                or end == len(loud)):
            return end
    return 0


def _loud_runs(loud: np.ndarray) -> list[tuple[int, int]]:
    """The runs of ``loud`` frames, in order: (first frame, frame after the last)."""
    starts = np.flatnonzero(loud & ~np.concatenate([[False], loud[:-1]]))
    ends = np.flatnonzero(loud & ~np.concatenate([loud[1:], [False]])) + 1
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def _rises(levels: np.ndarray, margin_db: float) -> bool:
    """Whether some frame of ``levels`` is more than ``margin_db`` above the quietest one
    before it: sound that starts, where a pause stays level or dies away."""
    return bool(np.any(levels - np.minimum.accumulate(levels) > margin_db))


def _frames(seconds: float, frame_shift_s: float) -> int:
    """``seconds`` in encoder frames, at least one."""
    return max(1, round(seconds / frame_shift_s))
