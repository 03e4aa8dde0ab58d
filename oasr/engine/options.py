"""The engine's command-line options: the flags every command that builds an engine takes
(``oasr transcribe``, ``oasr-server``), and the `EngineConfig` they make."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from oasr.decoding.endpoint import EndpointConfig
from oasr.engine.config import CUDA_GRAPH_MODES, SECOND_PASS_BEAM_SIZE, EngineConfig
from oasr.engine.live.quiet_tail import QuietTail
from oasr.engine.live.refine import RefineConfig
from oasr.models.whisper.logits import LOGITS_BACKENDS
from oasr.models.whisper.window import WINDOW_MODES, EncoderWindow

# Beam width used with an LM unless --beam-size says otherwise. On the bundled Whisper-CTC
# model with both LMs, held-out-sentence WER is 52.2% greedy, 21.8% at beam 8, 19.8% at beam 16
# and 18.6% at beam 32; the search costs ~22 / 36 / 55 ms of one CPU thread per 64-stream x
# 640 ms step at beam 8 / 16 / 32 (bench/decode_cost.py), beside ~240 ms for the encoder.
DEFAULT_LM_BEAM_SIZE = 16

# Attention history of the commands' engines, in chunks (8 x 640 ms = 5.1 s): a stream keeps at
# most 8 chunks of K/V and evicts the oldest block as each new chunk commits, so a chunk's cost
# stays flat however long a segment runs, and the demo's pool shows evictions as soon as
# someone speaks for more than 5 s. CTC WER of the bundled model at 8 vs unlimited history
# (bench/history_wer.py, docs/benchmarks.md): devset real 30.1 vs 30.7 %, synthetic 11.3 vs
# 11.3 %, long 25-36 s streams 26.6 vs 28.0 %: no loss. EngineConfig itself keeps -1 (all).
DEFAULT_NUM_LEFT_CHUNKS = 8

# oasr transcribe's --final-context: offline nothing waits on a final, so every segment is
# decoded after its predecessor's text (docs/model.md: "Context across segments")
OFFLINE_FINAL_CONTEXT_S = 10.0


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every command that builds an engine."""
    from oasr.decoding import GpuDecoderConfig

    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None,
                   help="model dir (oasr format: Conformer-CTC or Whisper-CTC; a WeNet "
                   "experiment dir; or an icefall Zipformer experiment dir); default: bundled "
                   "model")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    g.add_argument("--dtype", default="auto",
                   help="auto | float32 | float16 | bfloat16 | int8 (int8 encoder linears)")
    g.add_argument("--max-batch-size", type=int, default=EngineConfig.max_batch_size,
                   help="streams decoded at once (stream slots)")
    g.add_argument("--chunk-size", type=int, default=EngineConfig.chunk_size,
                   help="encoder frames per chunk; default: the model's trained chunk "
                   "(640 ms: 16 Conformer frames, 32 Whisper-CTC frames)")
    g.add_argument("--num-left-chunks", type=int, default=None,
                   help="attention history in chunks; older K/V blocks are evicted; -1 keeps "
                   f"everything (default: {DEFAULT_NUM_LEFT_CHUNKS}; an icefall Zipformer: its "
                   "own left context, 4 chunks)")
    g.add_argument("--max-num-blocks", type=int, default=None,
                   help="K/V pool size in blocks; default: derived from free memory")
    g.add_argument("--beam-size", type=int, default=None,
                   help="1 = greedy CTC, >1 = prefix beam; default: "
                   f"{DEFAULT_LM_BEAM_SIZE} when a char LM is used (see --lm), else 1")
    g.add_argument("--lm", default="auto",
                   help="LMs fused into beam search: auto (the model dir's char_lm.* and, when "
                   "present, word_lm.*), none, or a directory holding char_lm.safetensors + "
                   "char_lm.json (+ word_lm.txt + word_lm.json)")
    g.add_argument("--lm-weight", type=float, default=GpuDecoderConfig.lm_weight,
                   help="char LM weight of shallow fusion (beam search with an LM only); "
                   "default: the value tuned with the LM files")
    g.add_argument("--lm-unit-bonus", type=float, default=GpuDecoderConfig.lm_unit_bonus,
                   help="score added per emitted unit when an LM is used; default: tuned")
    g.add_argument("--lm-word-bonus", type=float, default=GpuDecoderConfig.lm_word_bonus,
                   help="score added per word boundary when an LM is used")
    g.add_argument("--lm-word-weight", type=float, default=GpuDecoderConfig.word_lm_weight,
                   help="word LM weight (with a word_lm.*); default: tuned")
    g.add_argument("--lm-oov-penalty", type=float, default=GpuDecoderConfig.word_oov_penalty,
                   help="penalty per word outside the word LM's lexicon; default: tuned")
    g.add_argument("--second-pass", choices=("whisper", "none"), default="whisper",
                   help="re-decode each finished segment with Whisper tiny.en for accurate finals")
    g.add_argument("--second-pass-process", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="run the second pass in a process of its own at a lower CPU priority, "
                   "so it never slows the streaming step (default: on for oasr-server, off "
                   "for oasr transcribe)")
    g.add_argument("--second-pass-processes", type=int, default=None, metavar="N",
                   help="with --second-pass-process: decode in N processes (each with the "
                   "second pass's threads), every job in the one with the fewest outstanding "
                   "(default: 2 for oasr-server on 2 or more cores, else 1)")
    g.add_argument("--second-pass-nice", type=int, default=EngineConfig.second_pass_nice,
                   metavar="N",
                   help="with --second-pass-process: how many CPU priority steps (nice, 0-19) "
                   "below the server the second pass runs")
    g.add_argument("--second-pass-yield", type=_seconds_or_off, default=EngineConfig.second_pass_yield_s,
                   metavar="S|off",
                   help="the second pass waits while a live stream has more than a chunk plus "
                   "S seconds of audio waiting to be decoded (partials first); off: it never "
                   "waits (oasr transcribe never waits: its audio waits by design)")
    g.add_argument("--second-pass-beam", type=int, default=SECOND_PASS_BEAM_SIZE,
                   help="Whisper's beam at temperature 0 (1 = greedy)")
    g.add_argument("--second-pass-logits", choices=LOGITS_BACKENDS,
                   default=EngineConfig().second_pass_decode.logits,
                   help="how Whisper's output projection (51,864 tokens x 384) multiplies on "
                   "CPU: int8 = int8 weights and rows (a quarter of the bytes per decode step), "
                   "auto = float32 through the faster BLAS (torch's or OpenBLAS), torch, blas")
    g.add_argument("--second-pass-window", choices=WINDOW_MODES, default="fit",
                   help="how much audio Whisper's encoder runs on for a final: fit = the "
                   "segment plus 2 s (the rest of the 30 s window is silence's states, "
                   "computed once; about half the decode time on CPU), full = the whole 30 s "
                   "window")
    g.add_argument("--final-context", type=float, default=None, metavar="S",
                   help="a segment's second pass also decodes the previous segment when it is "
                   "at most this long, continuing its final's text (short segments keep "
                   "their sentence's context); 0 decodes each segment alone (default: "
                   f"{OFFLINE_FINAL_CONTEXT_S:g} for oasr transcribe, 0 for a live server, "
                   "where it costs batching)")
    g.add_argument("--light-load-context", type=float,
                   default=EngineConfig.light_load_context_s, metavar="S",
                   help="as --final-context, while at most --light-load-streams streams are "
                   "live (a demo's load: the second pass has room for it); 0: only "
                   "--final-context")
    g.add_argument("--early-final", type=float, default=EngineConfig.early_final_s, metavar="S",
                   help="start a segment's final decode after this pause (s) after the last "
                   "word, before the endpoint, so the final is ready when the segment ends; "
                   "0 waits for the endpoint")
    g.add_argument("--sentence-end", type=float, default=EngineConfig.sentence_end_s,
                   metavar="S", help="end a segment after this pause (s) instead of the "
                   "endpoint's silence when its early final decode ends a sentence (., ?, ! "
                   "after 3 words; at a demo's load); 0: only the endpoint rules")
    g.add_argument("--refine-interval", type=float, default=RefineConfig.interval_s,
                   help="refined partials: re-decode an open segment with Whisper after this "
                   "many seconds of new audio, in spare capacity; 0 turns them off")
    g.add_argument("--refine-agreeing", type=int, default=RefineConfig.agreeing, metavar="N",
                   help="refined partials: commit (make stable) the words this many "
                   "refinements in a row agree on")
    g.add_argument("--refine-min-word-prob", type=float, default=RefineConfig.min_word_prob,
                   metavar="P", help="refined partials: ... and only words whose every token "
                   "each of those refinements generated with at least this probability (fewer "
                   "stable words, later finals); 0: agreement alone")
    g.add_argument("--refine-hold-words", type=int, default=RefineConfig.hold_words,
                   metavar="N", help="refined partials: ... and not the last N words the "
                   "oldest of those refinements heard (the end of its audio); 0: none")
    g.add_argument("--prefill-kv-window", action="store_true",
                   help="give each stream its whole --num-left-chunks window, zeroed, at "
                   "admission (models trained with a fixed attention window)")
    g.add_argument("--streaming-cohort-admit", action="store_true",
                   help="admit waiting streams shortest audio first (bounded by the wait "
                   "limit) instead of oldest first")
    g.add_argument("--quantization-option", action="append", default=[], metavar="KEY=VALUE",
                   help="second-pass decoder K/V format: kv_cache=fp8_e4m3 (float8 plus a "
                   "scale per token and head: ~1.9x the rows of float16 in the same memory)")
    g.add_argument("--decode-kv-budget-gib", type=float, default=None,
                   help="second-pass decoder K/V pool in GiB; default: --max-decode-slots "
                   "rows at their full length")
    g.add_argument("--max-decode-slots", type=int, default=None,
                   help="second-pass rows decoded at once (default: 16)")
    g.add_argument("--cuda-graphs", choices=CUDA_GRAPH_MODES, default="off",
                   help="capture the encoder step as one CUDA graph per batch width, replayed "
                   "over the padding lane (auto: on for CUDA, off on CPU); off by default "
                   "until it has run on a GPU (bench/gpu_check.sh)")
    g.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for the engine (default: torch's choice)")
    g.add_argument("--endpoint-pause", type=float, default=None, metavar="S",
                   help="sentence-pause endpointing: seconds of pause (blank frames) after 3 "
                        "words that end a segment (0.8 when only --max-segment is given); "
                        "default: WeNet's rules, 1 s of silence after speech")
    g.add_argument("--endpoint-between-chunks", action=argparse.BooleanOptionalAction,
                   default=True,
                   help="decide the endpoint's silence on the quiet audio after a stream's "
                   "last chunk too, so a segment ends when its silence is there, not at the "
                   "next 640 ms chunk (default: on; --no-endpoint-between-chunks decides only "
                   "at chunks, 0-0.64 s later)")
    g.add_argument("--light-load-streams", type=int, default=None, metavar="N",
                   help="while at most N streams are live, segments end between chunks and "
                   "finals start decoding at a pause (a demo's load); above it both wait for "
                   "chunks (default: 2 for each second-pass process)")
    g.add_argument("--max-segment", type=float, default=None, metavar="S",
                   help="sentence-pause endpointing: longest segment in seconds, cut at its "
                        "quietest point in the last 3 s (15 when only --endpoint-pause is "
                        "given); default: WeNet's 20 s")


def default_beam_size(model: str | None, lm: str) -> int:
    """The beam width when none is given: `DEFAULT_LM_BEAM_SIZE` when a char LM will be used
    (``lm`` names a directory, or is "auto" and the model directory has one), else 1."""
    from oasr.lm import has_char_lm
    from oasr.models.checkpoint import DEFAULT_MODEL_DIR

    if lm == "none":
        return 1
    if lm != "auto":
        return DEFAULT_LM_BEAM_SIZE
    model_dir = DEFAULT_MODEL_DIR if model is None else Path(model)
    return DEFAULT_LM_BEAM_SIZE if has_char_lm(model_dir) else 1


def endpoint_config_from_args(args: argparse.Namespace) -> EndpointConfig:
    """The endpoint rules: WeNet's silence rules (1 s of silence after speech), 20 s segments
    cut at their quietest point (`EndpointConfig.wenet_quiet_cut`), unless ``--endpoint-pause``
    / ``--max-segment`` ask for the sentence-pause rules (see `EngineConfig.endpoint`)."""
    pause = getattr(args, "endpoint_pause", None)
    longest = getattr(args, "max_segment", None)
    if pause is None and longest is None:
        return EndpointConfig.wenet_quiet_cut()
    config = EndpointConfig()
    if pause is not None and config.rule2 is not None:
        config = replace(config, rule2=replace(config.rule2, min_trailing_silence_s=pause))
    if longest is not None and config.rule3 is not None:
        config = replace(config, rule3=replace(config.rule3, min_utterance_length_s=longest),
                         max_cut_window_s=min(config.max_cut_window_s, longest / 2))
    return config


def default_num_left_chunks(model: str | None) -> int:
    """The history when none is given: `DEFAULT_NUM_LEFT_CHUNKS` for the paged families; an
    icefall Zipformer directory keeps EngineConfig's -1 (the slot runtime then uses its own
    left context, 4 chunks)."""
    from oasr.models.zipformer.checkpoint import is_icefall_dir

    if model is not None and is_icefall_dir(Path(model)):
        return EngineConfig.num_left_chunks
    return DEFAULT_NUM_LEFT_CHUNKS


# EngineConfig fields set by the flag of the same name (``--max-batch-size`` -> max_batch_size);
# the other flags are read by name in `engine_config_from_args`.
SAME_NAME_FIELDS = ("model", "device", "dtype", "max_batch_size", "chunk_size",
                    "prefill_kv_window", "max_num_blocks", "lm", "cuda_graphs", "second_pass",
                    "streaming_cohort_admit", "decode_kv_budget_gib", "max_decode_slots",
                    "light_load_streams")


def _seconds_or_off(value: str) -> float | None:
    """A flag's value in seconds (>= 0), or None for "off"."""
    if value == "off":
        return None
    seconds = float(value)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds or 'off', got {value}")
    return seconds


def engine_config_from_args(args: argparse.Namespace, **overrides: object) -> EngineConfig:
    """The `EngineConfig` the flags of `add_engine_arguments` describe, with ``overrides``
    (EngineConfig fields a command sets itself, e.g. ``oasr transcribe``'s unbounded waits)."""
    from oasr.decoding import GpuDecoderConfig
    from oasr.models.whisper.quantization import parse_quantization_options

    beam_size = args.beam_size
    if beam_size is None:
        beam_size = default_beam_size(args.model, args.lm)
    num_left_chunks = args.num_left_chunks
    if num_left_chunks is None:
        num_left_chunks = default_num_left_chunks(args.model)
    decoder = GpuDecoderConfig(beam_size=beam_size, lm_weight=args.lm_weight,
                               lm_unit_bonus=args.lm_unit_bonus, lm_word_bonus=args.lm_word_bonus,
                               word_lm_weight=args.lm_word_weight,
                               word_oov_penalty=args.lm_oov_penalty)
    config = EngineConfig(
        **{name: getattr(args, name) for name in SAME_NAME_FIELDS},
        num_left_chunks=num_left_chunks, decoder=decoder, num_threads=args.threads,
        endpoint=endpoint_config_from_args(args),
        second_pass_decode=replace(EngineConfig().second_pass_decode,
                                   beam_size=args.second_pass_beam,
                                   logits=args.second_pass_logits,
                                   encoder_window=EncoderWindow(args.second_pass_window)),
        refine=(RefineConfig(interval_s=args.refine_interval, agreeing=args.refine_agreeing,
                             min_word_prob=args.refine_min_word_prob,
                             hold_words=args.refine_hold_words)
                if args.refine_interval > 0 else None),
        final_context_s=(EngineConfig.final_context_s if args.final_context is None
                         else args.final_context),
        light_load_context_s=args.light_load_context,
        early_final_s=args.early_final,
        sentence_end_s=args.sentence_end,
        endpoint_quiet=QuietTail() if args.endpoint_between_chunks else None,
        second_pass_yield_s=args.second_pass_yield,
        second_pass_nice=args.second_pass_nice,
        second_pass_process=(EngineConfig.second_pass_process
                             if args.second_pass_process is None else args.second_pass_process),
        quantization=parse_quantization_options(args.quantization_option) or None,
    )
    # applied with the overrides, so that EngineConfig checks it beside the process flag
    # a command sets (oasr-server's default is a process)
    if args.second_pass_processes is not None:
        overrides = {"second_pass_processes": args.second_pass_processes, **overrides}
    return replace(config, **overrides)  # type: ignore[arg-type]
