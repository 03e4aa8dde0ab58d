"""ZipformerModel: an icefall streaming Zipformer2 (transducer and/or CTC) with icefall's API.

``forward_encoder``, ``get_init_states``, ``streaming_forward``, ``ctc_log_probs`` and
``greedy_search`` take and return what icefall's functions of those names do (batch-first
encoder output, icefall's flat state list), so icefall decode scripts port one call at a time.
Inside, state is named (`oasr.models.zipformer.states`): ``streaming_step`` takes and returns
a name -> tensor mapping, which is what the engine's slot cache gathers and scatters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from oasr.cache.state_spec import StreamStateSpec
from oasr.models.zipformer.beam_search import BeamState, beam_steps
from oasr.models.zipformer.config import ZipformerConfig
from oasr.models.zipformer.encoder import ZipformerEncoder
from oasr.models.zipformer.frontend import Conv2dSubsampling
from oasr.models.zipformer.states import (
    EMBED_STATE,
    PROCESSED_STATE,
    from_icefall_list,
    layer_states,
    named_layer_states,
    specs_from_init_states,
    streaming_init_states,
    to_icefall_list,
)
from oasr.models.zipformer.transducer import GreedyState, Joiner, StatelessDecoder, greedy_steps

LOG_EPS = -23.025850929940457  # log(1e-10): icefall's / lhotse's feature padding value


class ZipformerModel(nn.Module):
    """Front end, encoder and heads; holds no stream state.

    Attributes:
        config: the geometry and the decode-time chunk setting.
        tokens: ``tokens[i]`` is token id i (icefall's tokens.txt), or None.
        bpe_model: the sentencepiece model beside the checkpoint, or None.
    """

    def __init__(self, config: ZipformerConfig, tokens: list[str] | None = None,
                 bpe_model: Path | None = None) -> None:
        super().__init__()
        self.config = config
        self.tokens = tokens
        self.bpe_model = bpe_model
        self.encoder_embed = Conv2dSubsampling(config.feature_dim, config.encoder_dim[0])
        self.encoder = ZipformerEncoder(config)
        if config.use_transducer:
            self.decoder = StatelessDecoder(config.vocab_size, config.decoder_dim, config.context_size)
            self.joiner = Joiner(config.output_dim, config.decoder_dim, config.joiner_dim,
                                 config.vocab_size)
        if config.use_ctc:
            self.ctc_proj = nn.Linear(config.output_dim, config.vocab_size)

    # -- whole utterances ------------------------------------------------------------------------
    def forward_encoder(self, feats: Tensor, feats_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Whole utterances: full context (chunk_size -1) or simulated streaming (chunk-masked
        attention and chunkwise convs at the config's chunk and left context).

        Args:
            feats: (N, T, F) fbank, padded; feats_lens: (N,) valid frames.
        Returns:
            (N, T', output_dim) encoder output at 25 Hz, T' = ceil(((T - 7) // 2) / 2), and
            (N,) lengths ((feats_lens - 7) // 2 + 1) // 2.
        """
        cfg = self.config
        x, lens = self.encoder_embed(feats, feats_lens)  # (N, T50, C0)
        pad_mask = torch.arange(x.shape[1], device=x.device) >= lens.unsqueeze(1)  # (N, T50)
        left_chunks = -1
        if cfg.chunk_size > 0 and cfg.left_context_frames >= 0:
            left_chunks = max(cfg.left_context_frames // cfg.chunk_size, 1)
        out = self.encoder(x.transpose(0, 1), pad_mask, cfg.chunk_size, left_chunks)
        return out.transpose(0, 1), (lens + 1) // 2  # (N, T', C)

    # -- streaming -------------------------------------------------------------------------------
    # the engine serves this model on the slot runtime: every per-stream tensor is declared
    # (`slot_state_specs`), no paged K/V
    streaming_kind = "slot"

    def get_streaming_init_states(self, batch_size: int = 1,
                                  device: torch.device | str | None = None,
                                  dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """The zero state of ``batch_size`` streams by name, in icefall's order, each tensor
        shaped by the module that reads it (`states.streaming_init_states`); the model's
        device and dtype unless given (``processed_lens`` is int32)."""
        p = next(self.parameters())
        return streaming_init_states(self.encoder, self.encoder_embed, batch_size,
                                     device or p.device, dtype or p.dtype)

    @property
    def slot_state_specs(self) -> tuple[StreamStateSpec, ...]:
        """One spec per per-stream tensor, in icefall's state-list order, derived from
        `get_streaming_init_states` run on the meta device (`states.specs_from_init_states`):
        the slot runtime allocates exactly what the modules read.

        Raises:
            ValueError: a full-context model (no streaming state).
        """
        if not self.config.is_streaming:
            raise ValueError("a full-context Zipformer (chunk_size -1) has no streaming state: "
                             "load it with chunk_size > 0 to stream")
        specs = self.__dict__.get("_slot_state_specs")
        if specs is None:
            specs = tuple(specs_from_init_states(
                lambda batch: self.get_streaming_init_states(batch, "meta", torch.float32)))
            self.__dict__["_slot_state_specs"] = specs
        return specs

    def state_specs(self) -> list[StreamStateSpec]:
        """`slot_state_specs` as a list."""
        return list(self.slot_state_specs)

    def init_states(self, batch_size: int, device: torch.device | str | None = None) -> dict[str, Tensor]:
        """Zeroed named states for ``batch_size`` streams."""
        return self.get_streaming_init_states(batch_size, device)

    def get_init_states(self, batch_size: int = 1,
                        device: torch.device | str | None = None) -> list[Tensor]:
        """icefall's ``streaming_decode.get_init_states``: the flat list, all zeros."""
        return to_icefall_list(self.state_specs(), self.init_states(batch_size, device))

    def streaming_forward(self, window: Tensor, window_lens: Tensor,
                          states: Sequence[Tensor]) -> tuple[Tensor, Tensor, list[Tensor]]:
        """icefall's ``streaming_decode.streaming_forward`` (flat state list in and out)."""
        specs = self.state_specs()
        out, lens, new = self.streaming_step(window, window_lens, from_icefall_list(specs, states))
        return out, lens, to_icefall_list(specs, new)

    def streaming_step(self, window: Tensor, window_lens: Tensor,
                       states: Mapping[str, Tensor]) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One chunk of every stream in the batch, each at its own offset.

        Args:
            window: (N, 2 * chunk + 13, F) fbank windows (stride 2 * chunk), short ones padded
                with LOG_EPS; window_lens: (N,) valid frames (a padded window counted whole is
                what icefall's decode loop does when the longest window is short).
            states: the named states (``state_specs``), batch on each spec's slot axis.
        Returns:
            (N, chunk / 2, output_dim) encoder output, (N,) valid output frames, new states.
        Raises:
            ValueError: a window that does not give ``chunk_size`` frames.
        """
        cfg = self.config
        if not cfg.is_streaming:
            raise ValueError("streaming needs a model loaded with chunk_size > 0")
        x, x_lens, embed = self.encoder_embed.streaming_forward(
            window, window_lens, states[EMBED_STATE])  # (N, chunk, C0)
        if x.shape[1] != cfg.chunk_size:
            raise ValueError(f"a window of {window.shape[1]} frames gives {x.shape[1]} frames; "
                             f"chunk_size {cfg.chunk_size} needs {cfg.window_frames}")
        left = cfg.left_context_frames
        processed = states[PROCESSED_STATE]  # (N,) int32
        # cache slot j (0 = oldest) is unfilled while processed <= left - 1 - j
        slots = left - 1 - torch.arange(left, device=x.device)  # (left,)
        unfilled = processed.unsqueeze(1) <= slots  # (N, left)
        padded = torch.arange(x.shape[1], device=x.device) >= x_lens.unsqueeze(1)  # (N, chunk)
        pad_mask = torch.cat([unfilled, padded], dim=1)  # (N, left + chunk)
        out, new_layers = self.encoder.streaming_forward(
            x.transpose(0, 1), layer_states(cfg, states), pad_mask)  # (chunk / 2, N, C)
        new = named_layer_states(new_layers)
        new[EMBED_STATE] = embed
        new[PROCESSED_STATE] = (processed + x_lens).to(processed.dtype)
        return out.transpose(0, 1), (x_lens + 1) // 2, new

    # -- heads -----------------------------------------------------------------------------------
    def ctc_log_probs(self, encoder_out: Tensor) -> Tensor:
        """(N, T, output_dim) -> (N, T, vocab) float32 CTC log-probabilities.

        Raises:
            ValueError: the model has no CTC head.
        """
        if not self.config.use_ctc:
            raise ValueError("this Zipformer has no CTC head (trained with use_ctc false)")
        return self.ctc_proj(encoder_out).float().log_softmax(dim=-1)

    def greedy_search(self, encoder_out: Tensor, encoder_out_lens: Tensor) -> list[list[int]]:
        """icefall's ``greedy_search_batch``: at most one symbol per frame.

        Args:
            encoder_out: (N, T, output_dim); encoder_out_lens: (N,).
        Returns:
            Each utterance's token ids (without the start context).
        Raises:
            ValueError: the model has no transducer.
        """
        states = self.new_greedy_states(encoder_out.shape[0])
        self.greedy_step(self.joiner.encoder_proj(encoder_out),
                         [int(n) for n in encoder_out_lens.tolist()], states)
        return [s.tokens for s in states]

    def modified_beam_search(self, encoder_out: Tensor, encoder_out_lens: Tensor,
                             beam: int = 4) -> list[list[int]]:
        """icefall's ``modified_beam_search``: at most one symbol per frame, ``beam``
        hypotheses per utterance, the best by length-normalised log-probability.

        Args:
            encoder_out: (N, T, output_dim); encoder_out_lens: (N,).
        """
        states = self.new_beam_states(encoder_out.shape[0])
        self.beam_step(self.joiner.encoder_proj(encoder_out),
                       [int(n) for n in encoder_out_lens.tolist()], states, beam)
        return [list(s.best().tokens) for s in states]

    def new_beam_states(self, batch_size: int) -> list[BeamState]:
        """Fresh beams (the start context alone) for ``batch_size`` utterances."""
        self.new_greedy_states(0)  # raises for a model without a transducer
        return [BeamState.new(self.config.context_size, self.config.blank_id)
                for _ in range(batch_size)]

    def beam_step(self, encoder_proj: Tensor, lengths: list[int], states: list[BeamState],
                  beam: int) -> None:
        """Advance beams over (N, T, joiner_dim) projected frames (in place)."""
        unk = self.tokens.index("<unk>") if self.tokens and "<unk>" in self.tokens else None
        beam_steps(self.decoder, self.joiner, encoder_proj, lengths, states, beam,
                   self.config.blank_id, unk)

    def new_greedy_states(self, batch_size: int) -> list[GreedyState]:
        """Fresh greedy hypotheses for ``batch_size`` utterances."""
        if not self.config.use_transducer:
            raise ValueError("this Zipformer has no transducer (trained with use_transducer false)")
        return [GreedyState(self.config.context_size, self.config.blank_id)
                for _ in range(batch_size)]

    def greedy_step(self, encoder_proj: Tensor, lengths: list[int],
                    states: list[GreedyState]) -> None:
        """Advance greedy hypotheses over (N, T, joiner_dim) projected frames (in place)."""
        greedy_steps(self.decoder, self.joiner, encoder_proj, lengths, states,
                     self.config.blank_id)
