"""The icefall Zipformer family: oasr's slot runtime (no block pool, every cache a slot row).

A Zipformer's whole per-stream cache is fixed-extent (per layer a rolling key / nonlin /
value window and two conv tails, the ConvNeXt's 3 frames, a processed-length counter), so it
keeps no paged K/V at all: the model says ``streaming_kind = "slot"``, and every tensor is a
`StreamStateSpec` of its ``slot_state_specs`` (derived from its own
``get_streaming_init_states`` on the meta device) in one `SlotStateCache` (one row per stream
slot, plus a pad lane); a step gathers the cohort's rows, runs one batched ``streaming_step``
for streams at any offsets and scatters the new rows back. Decoding is greedy transducer
search (or the CTC head of a CTC-only model).

| | Zipformer (icefall) |
|---|---|
| features | kaldi-native-fbank, icefall's settings, LOG_EPS tail |
| chunk windows | 2 * chunk + 13 frames every 2 * chunk (chunk in 50 Hz frames) |
| encoder frame | 40 ms (front end 2x, output 2x) |
| fixed-extent state | everything: 6 tensors per layer + embed cache + processed_lens |
| positions | relative, a fixed left window |
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from oasr.audio import ChunkGeometry, FeatureSource
from oasr.cache import CacheConfig, SlotStateCache
from oasr.engine.families.base import ChunkBatch, FrameTiming, KVGeometry, ModelFamily

if TYPE_CHECKING:
    from oasr.models.zipformer.model import ZipformerModel

FBANK_PER_FRAME = 4  # 10 ms fbank frames per 40 ms encoder frame
WINDOW_RIGHT_CONTEXT = 16  # fbank frames past a chunk's own: 2 * chunk + 13 = 4 * (chunk/2 - 1) + 17


class ZipformerFamily(ModelFamily):
    """icefall's streaming Zipformer2 on the slot runtime: no paged blocks.

    Decoding is ``"transducer"`` (greedy, at most one symbol per frame) when the model has a
    transducer, else ``"ctc"``; `forward_chunk` returns what that decoder reads.
    """

    name = "zipformer"
    model: ZipformerModel
    float_linears = ("ctc_proj", "joiner.output_linear", "joiner.encoder_proj",
                     "joiner.decoder_proj")

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        from oasr.text.tokenizer import BpeTokenizer, CharTokenizer

        cfg = self.model.config
        if not cfg.is_streaming:
            raise ValueError("the engine streams: load the Zipformer with chunk_size > 0 "
                             "(e.g. load_model(dir, chunk_size=16, left_context_frames=64))")
        self.decoding = "transducer" if cfg.use_transducer else "ctc"
        tokens = self.model.tokens or [f"<{i}>" for i in range(cfg.vocab_size)]
        units = ["<blank>" if i == cfg.blank_id else t for i, t in enumerate(tokens)]
        bpe = self.model.bpe_model
        self._tokenizer = BpeTokenizer(units, bpe) if bpe is not None else CharTokenizer(units)

    @property
    def timing(self) -> FrameTiming:
        # encoder frame j reads fbank frames 4j .. 4j + 16; fbank frame i ends at sample
        # 160 i + 400: 160 * 16 + 400 - 640 = 2320 samples past the frame's own 640
        return FrameTiming(frame_shift_s=0.04, right_context_samples=2320)

    @property
    def default_chunk_size(self) -> int:
        """Encoder (25 Hz) frames per chunk: half the model's 50 Hz chunk_size."""
        return self.model.config.chunk_size // 2

    @property
    def max_positions(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def kv_geometry(self) -> KVGeometry:
        """Nominal: the family keeps no paged K/V (``streaming_kind = "slot"``); the engine
        builds no block pool for it. The widths only size the cache config's bookkeeping."""
        cfg = self.model.config
        return KVGeometry(num_layers=1, n_kv_head=1, head_dim=1,
                          hidden_dim=cfg.encoder_dim[0], kernel_size=cfg.cnn_module_kernel[0])

    def chunk_geometry(self, chunk_size: int) -> ChunkGeometry:
        """Raises ValueError for any chunk but the model's (its caches are sized for it)."""
        if chunk_size != self.default_chunk_size:
            raise ValueError(
                f"this Zipformer was loaded for chunks of {self.default_chunk_size} encoder frames "
                f"(chunk_size {self.model.config.chunk_size} at 50 Hz); chunk_size {chunk_size} "
                f"needs load_model(dir, chunk_size={2 * chunk_size})")
        return ChunkGeometry(chunk_size=chunk_size, subsampling=FBANK_PER_FRAME,
                             right_context=WINDOW_RIGHT_CONTEXT)

    def new_features(self) -> FeatureSource:
        from oasr.models.zipformer.features import icefall_features

        return icefall_features()

    def build_states(self, cache_config: CacheConfig, pad_lanes: int = 1) -> SlotStateCache:
        """Every declared tensor (``slot_state_specs``), one row per slot plus (at least) one
        pad lane."""
        return super().build_states(cache_config, max(1, pad_lanes))

    def forward_chunk(self, batch: ChunkBatch) -> Tensor:
        """One batched streaming step over the cohort's slot rows.

        Every window is padded to the full 2 * chunk + 13 frames with LOG_EPS and counted
        whole (icefall's decode of a lone stream), so a row's output never depends on the
        other rows. Returns (B, chunk / 2, joiner_dim) joiner-projected encoder frames for the
        transducer, or (B, chunk / 2, V) CTC log-probabilities.
        """
        feats = self.full_windows(batch.feats, batch.feat_lens)  # (B, W, F)
        lens = torch.full((feats.shape[0],), feats.shape[1], dtype=torch.int64, device=feats.device)
        states = {name: view.gather() for name, view in batch.states.items()}
        out, _, new = self.model.streaming_step(feats, lens, states)  # (B, chunk / 2, C)
        for name, view in batch.states.items():
            view.scatter(new[name])
        if self.decoding == "transducer":
            return self.model.joiner.encoder_proj(out)  # (B, T', J)
        return self.model.ctc_log_probs(out)  # (B, T', V)

    def full_windows(self, feats: Tensor, lens: Tensor) -> Tensor:
        """(B, T, F) windows with (B,) valid frames -> (B, 2 * chunk + 13, F), LOG_EPS past
        each row's frames."""
        from oasr.models.zipformer.model import LOG_EPS

        width = self.model.config.window_frames
        B, T, F = feats.shape
        full = feats.new_full((B, width, F), LOG_EPS)
        full[:, : min(T, width)] = feats[:, :width]
        pad = torch.arange(width, device=feats.device) >= lens.unsqueeze(1)  # (B, W)
        return full.masked_fill(pad.unsqueeze(-1), LOG_EPS)
