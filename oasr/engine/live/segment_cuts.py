"""Where a segment ends when an endpoint rule fires: the policy behind `ASREngine`'s cuts.

A pause inside the latest chunk ends the segment in its middle, where the endpointer says. A
silence rule whose pause trails the decoded audio would end it at the chunk's end, but the
CTC pass counts as blank the start of a word it has not written yet: a speaker who went on
after a short pause, at a chunk's end, lost the first sound of the next sentence ("She
ordered" began its segment as "order"). Such a cut moves back into the pause as the audio
tells it: the middle of the quietest run of frames (`quiet_middle`) after the last word
(`WORD_TAIL_S` after its last CTC token). A length endpoint (rule 3) looks back over the last
``max_cut_window_s`` and cuts at the quietest frame of the stream's audio (`FrameEnergy`), so a
long sentence is split in a breath, not mid-word, but never before the audio its committed
refined words came from. The frames after a cut in the past are
decoded again, so each stream's windower keeps that many feature frames.

Between chunks, the audio that arrived after a stream's last chunk may already hold the rest
of a pause (`QuietTail`): `in_quiet` asks the endpoint rules again with those quiet frames
counted as silence, so a segment ends when its silence is there, not at the next chunk.
"""

from __future__ import annotations

from dataclasses import replace

from oasr.audio import ChunkGeometry
from oasr.decoding import EndpointDecision, Endpointer, Hypothesis, quiet_middle, quietest_frame
from oasr.engine.live.quiet_tail import QuietTail
from oasr.engine.live.state import HeardPause, LiveStream

# a CTC token comes up to this long before its word's sound ends: a trailing pause's cut
# (`SegmentCuts.cut_frame`) is looked for after it
WORD_TAIL_S = 0.25


class SegmentCuts:
    """Turns an `EndpointDecision` into the frame where the segment ends (stateless; the
    energies live in each `LiveStream`)."""

    def __init__(self, endpointer: Endpointer | None, geometry: ChunkGeometry,
                 quiet: QuietTail | None = None) -> None:
        self.endpointer = endpointer
        self.quiet = quiet
        window = endpointer.max_cut_window_frames if endpointer is not None else 0
        # a cut reaches back at most the window, or (a pause) one chunk, before the chunk's end
        self.max_cut_back_frames = max(window, geometry.chunk_size)
        self.max_rewind_frames = self.max_cut_back_frames + geometry.chunk_size
        self.retain_feature_frames = self.max_rewind_frames * geometry.subsampling

    def cut_frame(self, stream: LiveStream, decision: EndpointDecision) -> int:
        """Frames of the current segment that the ending segment keeps.

        A length cut looks no further back than the audio a refinement with committed words
        has seen: those words were shown as never changing, so the final must begin with them
        (`FinalPublisher`), which it can only where its audio holds them; when that audio
        reaches the chunk's end, the segment ends there. A silence rule's pause that trails
        the decoded audio ends in its quiet middle (`_in_trailing_pause`)."""
        if self.endpointer is None:
            return decision.cut_frame
        if not decision.is_length_cut:
            return self._in_trailing_pause(stream, decision)
        start = stream.segment_start_frame
        end = start + decision.cut_frame
        refine = stream.refine
        committed = refine.refined_frames if refine and refine.agreement.committed else 0
        lo = max(start + 1, end - self.endpointer.max_cut_window_frames, start + committed)
        energy = stream.energy.span(lo, end)
        if len(energy) == 0:
            return decision.cut_frame
        return lo + quietest_frame(energy) - start + 1  # the segment keeps the quiet frame

    def _in_trailing_pause(self, stream: LiveStream, decision: EndpointDecision) -> int:
        """A silence rule's cut: when it is the chunk's end after a pause with speech before
        it, the middle of that pause's quietest run of frames, at least `WORD_TAIL_S` after
        the last CTC token and no further back than a length cut may reach (a client's long
        silence rule: the frames after a cut are decoded again, and the stream keeps only
        so many); else as decided (a rule that needs no silence, e.g. a length with the cut
        window off, ends at the chunk)."""
        cut, hyp = decision.cut_frame, stream.ctc_hyp
        endpointer = stream.endpointer or self.endpointer
        if (endpointer is None or not endpointer.is_silence_rule(decision.rule)
                or cut < stream.segment_frames or hyp is None or not hyp.timestamps):
            return cut
        start = stream.segment_start_frame
        tail = round(WORD_TAIL_S / endpointer.config.frame_shift_s)
        end = start + cut
        lo = max(start + hyp.timestamps[-1] + 1 + tail, stream.energy.first_frame,
                 end - self.max_cut_back_frames)  # (what the windower can decode again)
        energy = stream.energy.span(lo, end)
        if len(energy) < 2 or len(energy) != end - lo:  # no pause left, or not all held
            return cut
        return lo + quiet_middle(energy) - start

    @staticmethod
    def refined_before(stream: LiveStream, cut: int) -> bool:
        """Whether the newest refinement heard no word after ``cut`` of the segment's frames,
        so a segment ending there holds the audio of its refined words: the refinement heard
        no further than the cut, or heard only silence after it (no CTC token there: a
        sentence pause cut in its middle, the refinement made at that pause)."""
        refine = stream.refine
        if refine is None or refine.refined_frames <= cut:
            return True
        step = stream.last_step
        if step is None:
            return False
        return not any(cut <= frame < refine.refined_frames for frame in step.hypothesis.timestamps)

    @staticmethod
    def forget_words_past(stream: LiveStream, cut: int) -> None:
        """The segment ends after ``cut`` of its frames: when the newest refinement heard a
        word after the cut, its words may lie there, so the final is decoded without them,
        neither the committed ones forced nor the tentative ones as a draft."""
        refine = stream.refine
        if refine is not None and not SegmentCuts.refined_before(stream, cut):
            refine.prefix_tokens = refine.draft_tokens = ()

    def heard_pause(self, stream: LiveStream, hyp: Hypothesis | None) -> int:
        """The pause after the open segment's last word as its audio tells it, in frames: the
        quiet frames that end the audio received, after the sound of the word that holds
        ``hyp``'s last CTC token (`QuietTail.pause_after_speech` from that token on); 0 when
        the audio cannot tell (no quiet rules, no token, a pause not clearly quieter than
        the word). A CTC token comes before its word's sound ends (by up to a quarter of a
        second), so a pause counted from it is a breath's length too long."""
        endpointer = stream.endpointer or self.endpointer
        if self.quiet is None or endpointer is None or hyp is None or not hyp.timestamps:
            return 0
        token = stream.segment_start_frame + hyp.timestamps[-1]
        return self.quiet.pause_after_speech(stream.energy, token,
                                             endpointer.config.frame_shift_s)

    def in_quiet(self, stream: LiveStream) -> tuple[EndpointDecision | None, HeardPause | None]:
        """Between chunks: the endpoint a silence rule decides when the quiet frames after
        the stream's last chunk count as silence (its cut within the decoded audio), and the
        pause heard so far (None when nothing new arrived or no pause is heard).

        The pause continues the decoded one (its trailing blank frames, then the quiet
        audio), or, when the audio after the last chunk holds the end of a word the CTC pass
        has not decoded yet, it is the quiet after that word (`QuietTail.pause_after_speech`:
        an early final can start then, not a chunk later; no endpoint rule counts it)."""
        step, endpointer = stream.last_step, stream.endpointer or self.endpointer
        held = stream.energy.num_frames
        if (self.quiet is None or step is None or endpointer is None or stream.input_ended
                or held == stream.quiet_checked_at or not step.stats.has_speech):
            return None, None
        stream.quiet_checked_at = held
        stats, decoded_end = step.stats, stream.num_frames_decoded
        shift = endpointer.config.frame_shift_s
        run = self.quiet.quiet_run(stream.energy, decoded_end,
                                   stats.num_trailing_blank_frames, shift)
        quiet = run.frames
        if not quiet:
            after = self.quiet.pause_after_speech(stream.energy, decoded_end, shift)
            if not after:
                return None, None
            spoken_to = held - after + max(1, self.quiet.skip_frames(shift))
            return None, HeardPause(after, min(spoken_to, held), held)
        heard = replace(stats, num_frames=stats.num_frames + quiet,
                        num_trailing_blank_frames=stats.num_trailing_blank_frames + quiet)
        decision = endpointer.decide(heard, step.hypothesis.tokens, step.hypothesis.timestamps)
        pause = HeardPause(heard.num_trailing_blank_frames, decoded_end, decoded_end + quiet,
                           went_on=run.went_on)
        if decision is None or not endpointer.is_silence_rule(decision.rule):
            return None, pause  # (a length cut's rule has no silence)
        return replace(decision, cut_frame=min(decision.cut_frame, stream.segment_frames)), pause

    def forget_old_energy(self, stream: LiveStream) -> None:
        """Drop energies no cut can reach any more."""
        stream.energy.discard_before(stream.num_frames_decoded - self.max_rewind_frames)
