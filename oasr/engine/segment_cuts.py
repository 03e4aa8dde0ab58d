"""Where a segment ends when an endpoint rule fires: the policy behind `ASREngine`'s cuts.

Most endpoints end the segment where the endpointer says (the chunk's end, or the middle of a
pause inside the latest chunk). A length endpoint (rule 3) looks back over the last
``max_cut_window_s`` and cuts at the quietest frame of the stream's audio (`FrameEnergy`), so a
long sentence is split in a breath, not mid-word. The frames after a cut in the past are
decoded again, so each stream's windower keeps that many feature frames.
"""

from __future__ import annotations

from oasr.audio import ChunkGeometry
from oasr.decoding import EndpointDecision, Endpointer, quietest_frame
from oasr.engine.request import Request


class SegmentCuts:
    """Turns an `EndpointDecision` into the frame where the segment ends (stateless; the
    energies live in each `Request`)."""

    def __init__(self, endpointer: Endpointer | None, geometry: ChunkGeometry) -> None:
        self.endpointer = endpointer
        window = endpointer.max_cut_window_frames if endpointer is not None else 0
        # a cut reaches back at most the window, or (a pause) one chunk
        self.max_rewind_frames = max(window, geometry.chunk_size) + geometry.chunk_size
        self.retain_feature_frames = self.max_rewind_frames * geometry.subsampling

    def cut_frame(self, request: Request, decision: EndpointDecision) -> int:
        """Frames of the current segment that the ending segment keeps."""
        if not decision.is_length_cut or self.endpointer is None:
            return decision.cut_frame
        start = request.segment_start_frame
        end = start + decision.cut_frame
        lo = max(start + 1, end - self.endpointer.max_cut_window_frames)
        energy = request.energy.span(lo, end)
        if len(energy) == 0:
            return decision.cut_frame
        return lo + quietest_frame(energy) - start + 1  # the segment keeps the quiet frame

    def forget_old_energy(self, request: Request) -> None:
        """Drop energies no cut can reach any more."""
        request.energy.discard_before(request.num_frames_decoded - self.max_rewind_frames)
